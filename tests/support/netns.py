"""A cluster of "hosts" on one machine: Linux network namespaces made by the test (needs root).

    hub   (netns, 10.77.0.1 on bridge br0; `subnet` picks another /24): redis-server (AOF), stand-in model server, gateway
    a, b  (netns, 10.77.0.2/.3 via veth on br0): init, run and postrun pools, own sessions dir
    root  (the test, 10.77.0.254 via veth on br0): submits, watches, injects faults

Traffic between hosts goes only over the bridge. A host is killed with every process in its
namespace (`ip netns pids`), cut off by taking its veth down, and the hub's Redis is restarted
from its AOF. The hosts share one pid space and one filesystem (as namespaces do), so a pgid or a
path recorded on one host must never be used on another; each host gets its own sessions dir.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from polar_mq.store.pipeline import PipelineStore
from polar_mq.settings import PipelineSettings
from polar_mq.store.core import connect
from polar_mq.taskspec import parse_task
from polar_mq.tasks.app.celery import make_celery
from polar_mq.tasks.app.routing import INIT_TASK
from polar_mq.cli.up import wait_http

ROOT = Path(__file__).resolve().parents[2]


def netns_unavailable() -> str | None:
    """Why these tests cannot run here (None: they can)."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None:
        return "needs iproute2 (apt-get install -y iproute2)"
    if shutil.which("redis-server") is None:
        return "needs redis-server"
    probe = f"pmqprobe{os.getpid()}"
    if subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode != 0:
        return "cannot create network namespaces here"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def sh(*args: str) -> None:
    subprocess.run(list(args), check=True, capture_output=True)


@dataclass
class Host:
    name: str
    netns: str
    ip: str
    veth: str  # the bridge-side end (in the hub namespace)
    sessions_dir: Path
    procs: list[subprocess.Popen] = field(default_factory=list)


@dataclass
class Cluster:
    base: Path
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:5])
    hosts: dict[str, Host] = field(default_factory=dict)
    hub_procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    redis_port: int = 6390
    gateway_port: int = 8690
    model_port: int = 8691
    lease_ttl: float = 4.0
    # The bridge's /24 (hub .1, root .254, hosts .2 up): another cluster on the machine at the same
    # time (bench/bench_soak.py --hosts) takes another subnet, or the root namespace's routes clash.
    subnet: str = "10.77.0"
    # The stand-in's listen address in the hub: 0.0.0.0 lets the hosts call it directly too.
    model_host: str = "127.0.0.1"
    # Redis's AOF fsync: "always" for the restart scenarios, "no" for an AOF-less Redis as
    # `polar-mq up` runs it (the soak measures Redis's own CPU, not the disk's).
    appendfsync: str = "always"
    gateway_workers: int | None = 1  # None: the gateway's own default (serving.py)

    @property
    def hub_ip(self) -> str:
        return f"{self.subnet}.1"

    @property
    def root_ip(self) -> str:
        return f"{self.subnet}.254"

    @property
    def hub(self) -> str:
        return f"pmq{self.tag}hub"

    @property
    def redis_url(self) -> str:
        return f"redis://{self.hub_ip}:{self.redis_port}/0"

    @property
    def gateway_url(self) -> str:
        return f"http://{self.hub_ip}:{self.gateway_port}"

    @property
    def model_url(self) -> str:
        """The stand-in as the hosts reach it (model_host 0.0.0.0) or the hub itself does."""
        host = self.hub_ip if self.model_host == "0.0.0.0" else self.model_host
        return f"http://{host}:{self.model_port}"

    # --- network ------------------------------------------------------------------------------
    def build_network(self, names: list[str]) -> None:
        sh("ip", "netns", "add", self.hub)
        sh("ip", "-n", self.hub, "link", "set", "lo", "up")
        sh("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.hub, "addr", "add", f"{self.hub_ip}/24", "dev", "br0")
        sh("ip", "-n", self.hub, "link", "set", "br0", "up")
        # The test's own link (operator), in the root namespace.
        self._veth(f"pmq{self.tag}r", None, self.root_ip)
        for i, name in enumerate(names):
            ns = f"pmq{self.tag}{name}"
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            ip = f"{self.subnet}.{i + 2}"
            veth = self._veth(f"pmq{self.tag}{name}", ns, ip)
            sdir = self.base / f"host-{name}" / "sessions"
            sdir.mkdir(parents=True)
            self.hosts[name] = Host(name=name, netns=ns, ip=ip, veth=veth, sessions_dir=sdir)

    def _veth(self, stem: str, ns: str | None, ip: str) -> str:
        """A veth pair: `stem`h on the hub bridge, `stem`x with `ip` in `ns` (None: root ns)."""
        hub_end, far_end = f"{stem}h", f"{stem}x"
        sh("ip", "link", "add", hub_end, "type", "veth", "peer", "name", far_end)
        sh("ip", "link", "set", hub_end, "netns", self.hub)
        sh("ip", "-n", self.hub, "link", "set", hub_end, "master", "br0", "up")
        if ns is not None:
            sh("ip", "link", "set", far_end, "netns", ns)
        prefix = ["ip", "-n", ns] if ns else ["ip"]
        sh(*prefix, "addr", "add", f"{ip}/24", "dev", far_end)
        sh(*prefix, "link", "set", far_end, "up")
        return hub_end

    def cut(self, name: str) -> None:
        sh("ip", "-n", self.hub, "link", "set", self.hosts[name].veth, "down")

    def restore(self, name: str) -> None:
        sh("ip", "-n", self.hub, "link", "set", self.hosts[name].veth, "up")

    # --- processes ----------------------------------------------------------------------------
    def spawn(self, ns: str, args: list[str], log: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        fh = open(self.base / f"{log}.log", "ab")
        return subprocess.Popen(["ip", "netns", "exec", ns, *args], stdout=fh, stderr=subprocess.STDOUT,
                                cwd=ROOT, env={**os.environ, **(env or {})}, start_new_session=True)

    def start_hub(self, model_args: tuple[str, ...] = ()) -> None:
        data = self.base / "redis"
        data.mkdir(exist_ok=True)
        self.start_redis()
        py = sys.executable
        self.hub_procs["model"] = self.spawn(self.hub, [
            py, "-m", "polar_mq.dev.model_server", "--host", self.model_host, "--port", str(self.model_port),
            "--max-model-len", "65536", *model_args], "hub-model")
        self.hub_procs["gateway"] = self.spawn(self.hub, [
            py, "-m", "polar_mq.cli", "gateway", "--host", "0.0.0.0", "--port", str(self.gateway_port),
            "--public-url", self.gateway_url, "--redis", f"redis://127.0.0.1:{self.redis_port}/0",
            "--upstream", f"http://127.0.0.1:{self.model_port}",
            *(["--workers", str(self.gateway_workers)] if self.gateway_workers else [])], "hub-gateway",
            env={"POLAR_SPOOL_DIR": str(self.base / "spool")})
        wait_http(f"{self.gateway_url}/health", self.hub_procs["gateway"], 90)

    def start_redis(self) -> None:
        self.hub_procs["redis"] = self.spawn(self.hub, [
            "redis-server", "--port", str(self.redis_port), "--bind", "0.0.0.0", "--save", "",
            "--appendonly", "no" if self.appendfsync == "no" else "yes", "--appendfsync",
            "always" if self.appendfsync == "no" else self.appendfsync, "--dir", str(self.base / "redis"),
            "--protected-mode", "no"], "hub-redis")
        deadline = time.time() + 15
        while time.time() < deadline:
            try:
                if redis.Redis.from_url(self.redis_url, socket_connect_timeout=0.5).ping():
                    return
            except redis.RedisError:
                time.sleep(0.1)
        raise RuntimeError("hub redis did not start")

    def restart_redis(self) -> float:
        """SHUTDOWN (flushes the AOF) and start again from it. Returns seconds Redis was down."""
        t0 = time.time()
        try:
            redis.Redis.from_url(self.redis_url).shutdown(save=False)
        except redis.ConnectionError:
            pass
        self.hub_procs["redis"].wait(timeout=10)
        self.start_redis()
        return time.time() - t0

    def worker_env(self, host: Host) -> dict[str, str]:
        return {"POLAR_REDIS_URL": self.redis_url, "POLAR_GATEWAY_URL": self.gateway_url,
                "POLAR_NODE": host.name, "POLAR_SESSIONS_DIR": str(host.sessions_dir),
                "POLAR_RESULTS_DIR": str(self.base / f"host-{host.name}" / "results"),
                "POLAR_LEASE_TTL": str(self.lease_ttl), "POLAR_JANITOR_INTERVAL": "1",
                "POLAR_READY_CAPACITY": "2", "POLAR_MAX_ATTEMPTS": "4"}

    def start_pools(self, name: str, init: int = 2, run: int = 2, postrun: int = 1,
                    env: dict[str, str] | None = None) -> None:
        """The three stage pools of host `name`; `env` overrides worker_env (a pool, a lease TTL)."""
        host = self.hosts[name]
        for stage, conc in (("init", init), ("run", run), ("postrun", postrun)):
            host.procs.append(self.spawn(host.netns, [
                sys.executable, "-m", "polar_mq.cli", "worker", "--stage", stage, "--concurrency", str(conc),
                "--loglevel", "INFO"], f"{name}-{stage}", env={**self.worker_env(host), **(env or {})}))

    def wait_nodes(self, names: list[str], timeout: float = 60.0) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            pools = self.store.pools()
            have = {(p["node"], q) for p in pools if p.get("expires", 0) > time.time() for q in p["queues"]}
            if all((n, q) in have for n in names for q in ("init", f"run@{n}", f"postrun@{n}")):
                return
            time.sleep(0.3)
        raise AssertionError(f"pools did not come up: {self.store.pools()}")

    def kill_host(self, name: str) -> int:
        """SIGKILL every process in the host's namespace (a machine losing power)."""
        host = self.hosts[name]
        out = subprocess.run(["ip", "netns", "pids", host.netns], capture_output=True, text=True).stdout
        pids = [int(p) for p in out.split()]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in host.procs:
            proc.wait(timeout=10)
        host.procs.clear()
        return len(pids)

    def stop(self) -> None:
        for host in self.hosts.values():
            for proc in host.procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGTERM)
        for host in self.hosts.values():
            for proc in host.procs:
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
            self.kill_host(host.name)  # harnesses left behind
        for proc in self.hub_procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
        for host in self.hosts.values():
            subprocess.run(["ip", "netns", "del", host.netns], capture_output=True)
        subprocess.run(["ip", "link", "del", f"pmq{self.tag}rx"], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.hub], capture_output=True)

    # --- sessions -----------------------------------------------------------------------------
    @property
    def store(self) -> PipelineStore:
        return PipelineStore(connect(self.redis_url))

    def submit(self, body: dict[str, Any]) -> list[str]:
        task = parse_task(body)
        sids, _ = self.store.create_task(task)
        app = make_celery(PipelineSettings(redis_url=self.redis_url))
        for sid in sids:
            app.send_task(INIT_TASK, args=[sid], queue="init")
        return sids

    def wait(self, sids: list[str], timeout: float) -> list[Any]:
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                recs = self.store.get_sessions(sids)
                if len(recs) == len(sids) and all(r.state in ("COMPLETED", "ERROR", "TIMEOUT") for r in recs):
                    return recs
            except redis.RedisError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"not finished: {[(r.session_id[-8:], r.state, r.node) for r in self.store.get_sessions(sids)]}")

    def marks(self, session_id: str) -> list[str]:
        """The harness's start/end marks for a session, from every host's disk."""
        lines: list[str] = []
        for path in glob.glob(str(self.base / "host-*" / "sessions" / "*" / session_id / "marks")):
            lines += Path(path).read_text().split("\n")
        return [line for line in lines if line]
