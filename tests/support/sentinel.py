"""A Sentinel-managed Redis on loopback for tests: one primary, replicas (`redis-server
--replicaof`) and three `redis-sentinel` processes, each a real process on a free port."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from polar_mq.cli.embedded_redis import free_port

MASTER = "polar"


@dataclass
class Node:
    port: int
    proc: subprocess.Popen
    auth: tuple[str, str] | None = None  # (user, password) on a data node with ACL users

    @property
    def client(self) -> redis.Redis:
        user, password = self.auth or (None, None)
        return redis.Redis(port=self.port, socket_timeout=2, socket_connect_timeout=1, username=user,
                           password=password)


@dataclass
class SentinelCluster:
    base: Path
    nodes: list[Node] = field(default_factory=list)
    sentinels: list[Node] = field(default_factory=list)

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{MASTER}/0"

    def primary_port(self) -> int:
        for s in self.sentinels:
            try:
                host, port = s.client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER)
                return int(port)
            except (redis.RedisError, TypeError, ValueError):
                continue
        raise AssertionError("no sentinel answers")

    def primary(self) -> Node:
        port = self.primary_port()
        return next(n for n in self.nodes if n.port == port)

    def kill_primary(self) -> Node:
        node = self.primary()
        node.proc.send_signal(signal.SIGKILL)
        node.proc.wait()
        return node

    def wait_ready(self, replicas: int, timeout: float = 30.0) -> None:
        """Every sentinel knows the replicas and the other sentinels, and the replicas are in sync."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                ok = True
                for s in self.sentinels:
                    info = s.client.execute_command("SENTINEL", "MASTER", MASTER)
                    d = dict(zip(info[::2], info[1::2])) if isinstance(info, list) else info
                    d = {k.decode() if isinstance(k, bytes) else k: v for k, v in d.items()}
                    if int(d["num-slaves"]) < replicas or int(d["num-other-sentinels"]) < len(self.sentinels) - 1:
                        ok = False
                if ok and int(self.primary().client.info("replication")["connected_slaves"]) >= replicas:
                    return
            except (redis.RedisError, KeyError):
                pass
            time.sleep(0.2)
        raise AssertionError(f"sentinels not ready after {timeout} s")

    def stop(self) -> None:
        for n in [*self.sentinels, *self.nodes]:
            if n.proc.poll() is None:
                n.proc.kill()
                n.proc.wait()
        shutil.rmtree(self.base, ignore_errors=True)


def start_sentinel_cluster(base: Path, replicas: int = 2, sentinels: int = 3,
                           down_after_ms: int = 1000, acl: dict[str, str] | None = None) -> SentinelCluster:
    """`acl`: {"file": users.acl, "replica": its password, "sentinel": its password, "admin": its
    password} from `polar-mq redis-acl --sentinel`: every data node loads the file and replicates
    as `replica`, the Sentinels watch as `sentinel` (docs/deployment.md, "Redis ACL users")."""
    base.mkdir(parents=True, exist_ok=True)
    node_auth = ("admin", acl["admin"]) if acl else None
    redis_bin, sentinel_bin = shutil.which("redis-server"), shutil.which("redis-sentinel")
    assert redis_bin and sentinel_bin, "redis-server and redis-sentinel must be installed (apt: redis-sentinel)"
    cluster = SentinelCluster(base)
    try:
        primary_port = 0
        for i in range(1 + replicas):
            port = free_port()
            d = base / f"redis-{port}"
            d.mkdir()
            args = [redis_bin, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                    "--dir", str(d), "--protected-mode", "no", "--repl-diskless-sync", "yes",
                    "--repl-diskless-sync-delay", "0"]
            if acl:  # every node: after a failover the old primary replicates too
                conf = d / "acl.conf"
                conf.write_text(f'aclfile "{acl["file"]}"\nmasteruser replica\nmasterauth "{acl["replica"]}"\n')
                args.insert(1, str(conf))
            if i:
                args += ["--replicaof", "127.0.0.1", str(primary_port)]
            else:
                primary_port = port
            proc = subprocess.Popen(args, stdout=open(d / "log", "wb"), stderr=subprocess.STDOUT,
                                    start_new_session=True)
            cluster.nodes.append(Node(port, proc, node_auth))
            _wait_ping(port, auth=node_auth)
        for _ in range(sentinels):
            port = free_port()
            conf = base / f"sentinel-{port}.conf"
            conf.write_text(f"port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {base}\n"
                            f"sentinel monitor {MASTER} 127.0.0.1 {primary_port} 2\n"
                            f"sentinel down-after-milliseconds {MASTER} {down_after_ms}\n"
                            f"sentinel failover-timeout {MASTER} 10000\n"
                            f"sentinel parallel-syncs {MASTER} 2\n" +
                            (f"sentinel auth-user {MASTER} sentinel\nsentinel auth-pass {MASTER} {acl['sentinel']}\n"
                             if acl else ""))
            proc = subprocess.Popen([sentinel_bin, str(conf)], stdout=open(base / f"sentinel-{port}.log", "wb"),
                                    stderr=subprocess.STDOUT, start_new_session=True)
            cluster.sentinels.append(Node(port, proc))
            _wait_ping(port)
        cluster.wait_ready(replicas)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _wait_ping(port: int, timeout: float = 10.0, auth: tuple[str, str] | None = None) -> None:
    user, password = auth or (None, None)
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if redis.Redis(port=port, socket_timeout=0.5, socket_connect_timeout=0.5, username=user,
                           password=password).ping():
                return
        except redis.RedisError:
            time.sleep(0.05)
    raise AssertionError(f"nothing answers on port {port}")
