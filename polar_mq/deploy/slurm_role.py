"""What a `polar-mq deploy slurm` job runs: `python -m polar_mq.deploy.slurm_role ROLE --state DIR`.

Each role first checks what it needs, for at most the deployment's `preflight_timeout`: the hub
its Redis (and a gateway, for the API); a gateway the hub's Redis and its upstreams (the
stand-in's published URL or the configured vLLM roots); a stage pool the hub's Redis and a
gateway (the one on its own node when there is one). Anything missing ends the job non-zero with
one line saying what could not be reached (tests/deploy/test_slurm.py::test_role_fails_without_hub)
instead of a pool idling against nothing. Then the services run as children of this process,
their output in the job's --output file; a child that dies fails the job, SIGTERM (scancel) stops
them all. Endpoints are published as `DIR/run/<role>*.json` (0600: the Redis URL has its password).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any, Callable

from polar_mq.deploy.slurm_config import Deployment

RUN = "run"


class RoleError(RuntimeError):
    """The role cannot work (an input unreachable); the job fails with this message."""


def _redact(url: str) -> str:
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url


def advertised(dep: Deployment) -> str:
    if dep.advertise == "hostname":
        return socket.gethostname()
    if dep.advertise == "fqdn":
        return socket.getfqdn()
    return dep.advertise


def pick_port(dep: Deployment, port: int) -> int:
    if port:
        return port
    with socket.socket() as s:
        s.bind((dep.bind, 0))
        return int(s.getsockname()[1])


def node_name() -> str:
    """This node's Slurm name (what a nodelist says), else its hostname."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def publish(state: Path, name: str, data: dict[str, Any]) -> None:
    """Write `state/run/<name>.json` atomically, mode 0600."""
    run = state / RUN
    run.mkdir(parents=True, exist_ok=True)
    tmp = run / f".{name}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, run / f"{name}.json")


def wait_for(what: str, probe: Callable[[], Any], timeout: float, hint: str = "") -> Any:
    """Poll `probe` (a value, or None / an exception: not yet) until it gives a value; RoleError
    naming `what` and the last problem when `timeout` runs out."""
    deadline = time.time() + timeout
    last = "not published yet"
    while True:
        try:
            value = probe()
            if value:
                return value
        except RoleError:
            raise  # known for good (a job that ended): no point waiting
        except Exception as exc:  # noqa: BLE001 — any failure of a probe is "not reachable yet"
            last = f"{type(exc).__name__}: {exc}"
        if time.time() >= deadline:
            raise RoleError(f"cannot reach {what} after {timeout:g} s ({last}){hint}")
        time.sleep(0.5)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except (OSError, ValueError):
        return None


def ping_redis(url: str) -> bool:
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2) \
        if not url.startswith("redis+sentinel://") else None
    if client is None:
        from polar_mq.store.core import connect

        return bool(connect(url).ping())
    try:
        return bool(client.ping())
    finally:
        client.close()


def http_ok(url: str) -> bool:
    import requests

    resp = requests.get(url, timeout=3)
    if resp.status_code >= 400:
        raise RuntimeError(f"HTTP {resp.status_code} from {url}")
    return True


class Children:
    """The services of this job: started in order, watched together, stopped on SIGTERM."""

    def __init__(self, role: str) -> None:
        self.role = role
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.stopping = False
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:  # noqa: ARG002
        """scancel's SIGTERM: leave whatever is running (a preflight wait too) and stop the children."""
        if not self.stopping:
            self.stopping = True
            raise KeyboardInterrupt

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        say(self.role, f"starting {name}: {' '.join(a for a in argv if '://' not in a or '@' not in a)}")
        proc = subprocess.Popen(argv, env={**os.environ, **env}, stdin=subprocess.DEVNULL)
        self.procs.append((name, proc))
        return proc

    def check(self) -> None:
        for name, proc in self.procs:
            if proc.poll() is not None:
                raise RoleError(f"{name} exited with {proc.returncode}")
        if self.stopping:
            raise KeyboardInterrupt

    def wait_http(self, url: str, timeout: float) -> None:
        deadline = time.time() + timeout
        while True:
            self.check()
            try:
                if http_ok(url):
                    return
            except Exception:  # noqa: BLE001
                pass
            if time.time() > deadline:
                raise RoleError(f"{url} did not answer within {timeout:g} s")
            time.sleep(0.3)

    def watch(self) -> None:
        while True:
            self.check()
            time.sleep(0.5)

    def stop(self) -> None:
        for _, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        deadline = time.time() + 20
        for _, proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                proc.kill()


def say(role: str, message: str) -> None:
    print(f"polar_mq slurm {role}: {message}", file=sys.stderr, flush=True)


def hub_redis(state: Path, dep: Deployment, timeout: float) -> str:
    """The Redis URL the hub published (waiting for it), checked with a PING."""
    hint = f" — is the hub job running? its log is under {state}/logs/"
    hub = wait_for("the hub (run/hub.json)", lambda: (read_json(state / RUN / "hub.json") or {}).get("redis_url"),
                   timeout, hint)
    wait_for(f"Redis at {_redact(hub)}", lambda: ping_redis(hub), timeout, hint)
    return str(hub)


def upstreams(state: Path, dep: Deployment, timeout: float) -> list[str]:
    if dep.standin:
        want = dep.roles["standin"].count if not dep.roles["standin"].nodelist else 1

        def found() -> list[str] | None:
            urls = [d["url"] for d in (read_json(p) for p in sorted((state / RUN).glob("standin-*.json"))) if d]
            return urls if len(urls) >= want else None

        urls: list[str] = wait_for("the stand-in model server (run/standin-*.json)", found, timeout,
                                   f" — see the standin job's log under {state}/logs/")
    elif dep.upstream_jobs:
        urls = []
        for up in dep.upstream_jobs:
            jid, port = str(up["job"]), int(up["port"])
            urls.append(wait_for(f"the vLLM job {jid}", partial(job_url, jid, port), timeout,
                                 f" — is job {jid} running?"))
    else:
        urls = list(dep.upstreams)
    for url in urls:
        wait_for(f"the upstream {url}", partial(http_ok, f"{url}/v1/models"), timeout)
    return urls


def job_url(job_id: str, port: int) -> str | None:
    """`http://NODE:PORT` of a running Slurm job (its first node); None while it is pending;
    RoleError once it has ended."""
    out = subprocess.run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T|%N"], capture_output=True,
                         text=True, timeout=30)
    state, _, nodes = out.stdout.strip().partition("|")
    if state == "RUNNING" and nodes:
        first = subprocess.run(["scontrol", "show", "hostnames", nodes], capture_output=True, text=True,
                               timeout=30).stdout.split()
        return f"http://{(first or [nodes])[0]}:{port}"
    if state in ("", "PENDING", "CONFIGURING"):
        if not state and out.returncode != 0:
            raise RoleError(f"Slurm does not know job {job_id}: {out.stderr.strip()}")
        return None
    raise RoleError(f"the vLLM job {job_id} is {state}")


def local_gateway(state: Path, timeout: float) -> str:
    """A gateway's URL: the one on this node when there is one, else any (all share the hub's
    Redis, so every gateway serves every session)."""
    me = node_name()

    def found() -> str | None:
        gws = [d for d in (read_json(p) for p in sorted((state / RUN).glob("gateway-*.json"))) if d]
        mine = [g for g in gws if g.get("node") == me]
        return str((mine or gws)[0]["url"]) if gws else None

    url: str = wait_for("a gateway (run/gateway-*.json)", found, timeout,
                        f" — see the gateway jobs' logs under {state}/logs/")
    wait_for(f"the gateway {url}", lambda: http_ok(f"{url}/health"), timeout)
    return url


def run_role(role: str, state: Path, index: int) -> int:
    record = json.loads((state / "deployment.json").read_text())
    dep = Deployment.from_dict(record["deployment"])
    py = sys.executable
    timeout = dep.preflight_timeout
    addr = advertised(dep)
    job = os.environ.get("SLURM_JOB_ID", str(os.getpid()))
    spec = dep.roles[role]
    if role in ("init", "run", "postrun"):
        redis_url = hub_redis(state, dep, timeout)
        gateway = local_gateway(state, timeout)
        api = (read_json(state / RUN / "hub.json") or {}).get("api_url") or ""
        os.environ.update({"POLAR_REDIS_URL": redis_url, "POLAR_GATEWAY_URL": gateway, "POLAR_API_URL": api})
        say(role, f"Redis {_redact(redis_url)} and gateway {gateway} reachable; starting the pool")
        argv = [py, "-m", "polar_mq.cli", "worker", "--stage", role, "--concurrency", str(spec.concurrency)]
        os.execv(py, argv)  # the pool is the job's process: scancel's SIGTERM reaches Celery itself
    kids = Children(role)
    try:
        if role == "hub":
            if dep.hub_redis:
                port = pick_port(dep, spec.redis_port)
                password = (state / "redis.password").read_text().strip()
                data = state / "redis"
                data.mkdir(exist_ok=True, mode=0o700)
                conf = data / "redis.conf"
                fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as fh:
                    fh.write(f"port {port}\nbind {dep.bind}\nrequirepass {password}\ndir {data}\n"
                             "appendonly yes\nsave \"\"\nprotected-mode yes\ndaemonize no\n")
                from polar_mq.cli.embedded_redis import server_binary

                binary = server_binary()
                if binary is None:
                    raise RoleError("no redis-server on this node (install it, or set `redis:` to a URL)")
                kids.start("redis-server", [binary, str(conf)], {})
                redis_url = f"redis://:{password}@{addr}:{port}/0"
                deadline = time.time() + timeout
                while True:
                    kids.check()
                    try:
                        if ping_redis(redis_url):
                            break
                    except Exception as exc:  # noqa: BLE001
                        if time.time() > deadline:
                            raise RoleError(f"the hub's redis-server did not answer on {addr}:{port}: {exc}")
                    time.sleep(0.2)
            else:
                redis_url = dep.redis
                wait_for(f"Redis at {_redact(redis_url)}", lambda: ping_redis(redis_url), timeout)
            publish(state, "hub", {"redis_url": redis_url, "node": node_name(), "job_id": job})
            say("hub", f"Redis {_redact(redis_url)} up; waiting for a gateway before the API")
            gateway = local_gateway(state, timeout)
            api_port = pick_port(dep, spec.port)
            kids.start("api", [py, "-m", "polar_mq.cli", "api", "--host", dep.bind, "--port", str(api_port), *spec.args],
                       {"POLAR_REDIS_URL": redis_url, "POLAR_GATEWAY_URL": gateway})
            api_url = f"http://{addr}:{api_port}"
            kids.wait_http(f"{api_url}/health", timeout)
            publish(state, "hub", {"redis_url": redis_url, "api_url": api_url, "node": node_name(),
                                   "job_id": job})
            say("hub", f"API {api_url} up")
        elif role == "standin":
            port = pick_port(dep, spec.port)
            kids.start("model-server", [py, "-m", "polar_mq.dev.model_server", "--host", dep.bind, "--port", str(port),
                                        *spec.args], {})
            url = f"http://{addr}:{port}"
            kids.wait_http(f"{url}/health", timeout)
            publish(state, f"standin-{index}", {"url": url, "node": node_name(), "job_id": job})
            say("standin", f"stand-in model server {url} up")
        elif role == "gateway":
            redis_url = hub_redis(state, dep, timeout)
            ups = upstreams(state, dep, timeout)
            port = pick_port(dep, spec.port)
            url = f"http://{addr}:{port}"
            argv = [py, "-m", "polar_mq.cli", "gateway", "--host", dep.bind, "--port", str(port), "--public-url", url]
            for u in ups:
                argv += ["--upstream", u]
            kids.start("gateway", argv + spec.args, {"POLAR_REDIS_URL": redis_url})
            kids.wait_http(f"{url}/health", timeout)
            publish(state, f"gateway-{index}", {"url": url, "node": node_name(), "job_id": job})
            say("gateway", f"gateway {url} up (upstreams {', '.join(ups)})")
        else:
            raise RoleError(f"unknown role {role!r}")
        kids.watch()
    except KeyboardInterrupt:
        say(role, "stopping (signal)")
        kids.stop()
        return 0
    except RoleError as exc:
        say(role, f"FAILED: {exc}")
        kids.stop()
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m polar_mq.deploy.slurm_role")
    parser.add_argument("role", choices=["hub", "standin", "gateway", "init", "run", "postrun"])
    parser.add_argument("--state", required=True, type=Path)
    parser.add_argument("--index", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        return run_role(args.role, args.state, args.index)
    except RoleError as exc:
        say(args.role, f"FAILED: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
