"""`polar-mq up`: every role on one machine, no root — a tiny supervisor.

Embedded Redis when none is configured, the stand-in model server when no upstream is given,
then the gateway, the rollout API, the three stage pools and Flower as child processes. SIGTERM
or SIGINT stops them all; a child that dies takes the whole group down (loudly); `up` dying, even
by kill -9, takes its children with it (supervise.py). The embedded Redis keeps its data in
`$POLAR_HOME/redis/` (append-only file) for the next `up`; `--fresh` starts from nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from polar_mq import auth as tokens
from polar_mq.cli import slots
from polar_mq.cli.common import redact_url
from polar_mq.cli.embedded_redis import ensure_redis, free_port, password_file
from polar_mq.runtimes.logcap import RotatingLog, pump
from polar_mq.settings import TokenSettings, polar_home
from polar_mq._io.supervise import UpLock, die_with_parent
from polar_mq.tasks.app.routing import QUEUES


class PortsTaken(RuntimeError):
    """A port `launch` was asked to bind is taken; nothing was started."""


@dataclass
class Child:
    name: str
    proc: subprocess.Popen


def wait_http(url: str, proc: subprocess.Popen | None = None, timeout: float = 120.0) -> None:
    """Poll `url` until it answers below 500; RuntimeError if `proc` exits or time runs out."""
    deadline = time.time() + timeout
    last: Exception | None = None
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process for {url} exited with {proc.returncode}")
        try:
            if requests.get(url, timeout=1).status_code < 500:
                return
        except requests.RequestException as exc:
            last = exc
        time.sleep(0.1)
    raise RuntimeError(f"{url} not ready after {timeout:g} s: {last}")


class Supervisor:
    def __init__(self, log_dir: Path, env: dict[str, str], lock: UpLock | None = None):
        self.log_dir = log_dir
        self.env = env
        self.children: list[Child] = []
        self.lock = lock  # lists each child for a later `up` to end (supervise.py)

    def spawn(self, name: str, args: list[str]) -> Child:
        """Start a child; its output goes through a pipe into `<log_dir>/<name>.log`, rotated at
        POLAR_LOG_MAX_BYTES (polar_mq/runtimes/logcap.py)."""
        log = RotatingLog(self.log_dir / f"{name}.log")
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env={**os.environ, **self.env},
                                start_new_session=True, preexec_fn=die_with_parent(signal.SIGKILL))
        if self.lock is not None:
            self.lock.add_child(name, proc.pid)
        pump(proc.stdout, log)  # type: ignore[arg-type]
        child = Child(name, proc)
        self.children.append(child)
        return child

    def stop(self) -> None:
        for child in reversed(self.children):
            if child.proc.poll() is None:
                try:
                    os.killpg(child.proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.time() + 15
        for child in self.children:
            try:
                child.proc.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                os.killpg(child.proc.pid, signal.SIGKILL)

    def watch(self) -> int:
        stop = {"flag": False}

        def handler(signum, frame):  # noqa: ARG001
            stop["flag"] = True

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)
        while not stop["flag"]:
            for child in self.children:
                if child.proc.poll() is not None:
                    print(f"{child.name} exited with {child.proc.returncode}; stopping everything "
                          f"(logs in {self.log_dir})", file=sys.stderr, flush=True)
                    return 1
            time.sleep(0.5)
        return 0


@dataclass
class Stack:
    """A running polar_mq: URLs of its parts and the supervisor that owns the processes."""

    supervisor: Supervisor
    api_url: str
    gateway_url: str
    redis_url: str
    upstreams: list[str]
    flower_url: str | None
    log_dir: Path
    embedded: object | None
    token: str | None = None  # the API's bearer token (None: started with dev=True, open)
    gateway_token: str | None = None

    @property
    def api_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    @property
    def gateway_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.gateway_token}"} if self.gateway_token else {}

    def stop(self) -> None:
        self.supervisor.stop()
        if self.embedded is not None:
            self.embedded.stop()  # type: ignore[attr-defined]

    def describe(self) -> str:
        return (f"  API      {self.api_url}\n  viewer   {self.api_url}/ui/  (sign in: ?token=<API token>)\n"
                f"  gateway  {self.gateway_url}\n"
                f"  upstream {', '.join(self.upstreams)}\n"
                f"  redis    {redact_url(self.redis_url)}"
                f"{' (embedded; password in ' + str(password_file()) + ')' if self.embedded else ''}\n"
                + (f"  flower   {self.flower_url} (user polar, password: the token)\n" if self.flower_url else "")
                + f"  logs     {self.log_dir}\n"
                + (f"  token    {TokenSettings.from_env().token_file} (or $POLAR_API_TOKEN)" if self.token
                   else "  token    NONE: --dev, every service is open"))


def launch(*, host: str = "127.0.0.1", api_port: int = 8700, gateway_port: int = 8600,
           flower_port: int = 5555, redis: str | None = None, upstreams: list[str] | None = None,
           concurrency: tuple[int | None, ...] = (None, None, None), flower: bool = True,
           extra_env: dict[str, str] | None = None, dev: bool = False,
           data_dir: Path | None = None, fresh: bool = False, lock: UpLock | None = None) -> Stack:
    """Start every role as child processes and wait until the API and gateway answer.

    Every service requires the token (generated into $POLAR_HOME/token when none is set) and
    binds to `host` (loopback by default); the children get the token through their settings
    (POLAR_API_TOKEN / POLAR_GATEWAY_TOKEN in their environment, never a sandbox's). Flower asks
    for HTTP basic auth: user ``polar``, the token as password. `dev` serves everything open."""
    ports = {"api": api_port, "gateway": gateway_port}
    if flower and importlib.util.find_spec("flower") is not None:
        ports["flower"] = flower_port
    from polar_mq.cli.preflight import taken

    problems = taken(host, ports)
    if problems:  # before anything starts (tests/cli/test_cli_newcomer.py)
        raise PortsTaken("; ".join(problems))
    py = sys.executable
    log_dir = Path(os.environ.get("POLAR_LOG_DIR") or Path.home() / ".cache" / "polar_mq" / "logs" /
                   time.strftime("%Y%m%d-%H%M%S"))
    log_dir.mkdir(parents=True, exist_ok=True)
    redis_url, embedded = ensure_redis(redis, data_dir=data_dir, fresh=fresh)
    if embedded is not None and lock is not None:
        lock.add_child("redis", embedded.process.pid)
    gateway_url = f"http://{host}:{gateway_port}"
    api_url = f"http://{host}:{api_port}"
    env = {"POLAR_REDIS_URL": redis_url, "POLAR_GATEWAY_URL": gateway_url, "POLAR_API_URL": api_url}
    if dev:
        api_token = gateway_token = None
        env["FLOWER_UNAUTHENTICATED_API"] = "true"
        tokens.warn_open("up")
    else:
        api_token, gateway_token = tokens.server_token("api"), tokens.server_token("gateway")
        env.update({"POLAR_API_TOKEN": api_token, "POLAR_GATEWAY_TOKEN": gateway_token,
                    "FLOWER_BASIC_AUTH": f"polar:{api_token}"})
    if not (flower and importlib.util.find_spec("flower") is not None):
        env.setdefault("POLAR_TASK_EVENTS", os.environ.get("POLAR_TASK_EVENTS", "0"))  # only Flower reads them
    env.update(extra_env or {})
    sup = Supervisor(log_dir, env, lock)
    try:
        upstreams = list(upstreams or [])
        if not upstreams:
            port = free_port()
            ms = sup.spawn("model_server", [py, "-m", "polar_mq.dev.model_server", "--host", "127.0.0.1",
                                            "--port", str(port)])
            upstreams = [f"http://127.0.0.1:{port}"]
            wait_http(f"{upstreams[0]}/health", ms.proc)
        # The Redis URL (with the embedded Redis's password) goes by POLAR_REDIS_URL in `env`,
        # never on a command line (which every local user can read).
        gw_args = [py, "-m", "polar_mq.cli", "gateway", "--host", host, "--port", str(gateway_port),
                   *(["--dev"] if dev else [])]
        for up in upstreams:
            gw_args += ["--upstream", up]
        gw = sup.spawn("gateway", gw_args)
        api = sup.spawn("api", [py, "-m", "polar_mq.cli", "api", "--host", host, "--port", str(api_port),
                                *(["--dev"] if dev else [])])
        pools = []
        for stage, n in zip(QUEUES, concurrency):
            pool, sized, _ = slots.sizing(stage, {**os.environ, **env})
            pools.append(f"{stage} {pool}×{n or sized}")
            sup.spawn(f"worker_{stage}", [py, "-m", "polar_mq.cli", "worker", "--stage", stage,
                                          "--concurrency", str(n or sized)])
        print(f"polar-mq up: pools {', '.join(pools)} (host: {slots.host().describe()})", flush=True)
        flower_url = fl = None
        if flower and importlib.util.find_spec("flower") is not None:
            fl = sup.spawn("flower", [py, "-m", "celery", "-A", "polar_mq.tasks.worker.main:app", "flower",
                                 f"--port={flower_port}", f"--address={host}"])
            flower_url = f"http://{host}:{flower_port}"
        wait_http(f"{gateway_url}/health", gw.proc)
        wait_http(f"{api_url}/health", api.proc)
        if fl is not None:
            wait_http(f"{flower_url}/healthcheck", fl.proc)
    except BaseException:
        sup.stop()
        if embedded:
            embedded.stop()
        raise
    return Stack(sup, api_url, gateway_url, redis_url, upstreams, flower_url, log_dir, embedded,
                 token=api_token, gateway_token=gateway_token)


def main(args: argparse.Namespace) -> int:
    home = polar_home()
    lock = UpLock(home)
    try:
        lock.acquire()
    except RuntimeError as exc:
        print(f"polar-mq up: {exc}", file=sys.stderr, flush=True)
        return 2
    try:
        lock.end_leftovers()  # what a previous `up` killed before it could stop them left running
        data_dir = None if (args.redis or os.environ.get("POLAR_REDIS_URL")) else home / "redis"
        stack = launch(host=args.host, api_port=args.api_port, gateway_port=args.gateway_port,
                       flower_port=args.flower_port, redis=args.redis, upstreams=args.upstream,
                       concurrency=(args.init_concurrency, args.run_concurrency, args.postrun_concurrency),
                       flower=not args.no_flower, dev=args.dev, data_dir=data_dir,
                       fresh=bool(getattr(args, "fresh", False)), lock=lock)
        try:
            print("polar_mq is up\n" + stack.describe(), flush=True)
            return stack.supervisor.watch()
        finally:
            stack.stop()
    finally:
        lock.release()
