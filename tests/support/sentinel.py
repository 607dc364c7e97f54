"""A Sentinel-managed Redis on loopback for tests: one primary, replicas (`redis-server
--replicaof`) and three `redis-sentinel` processes, each a real process on a free port."""

from __future__ import annotations

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
    tls: Path | None = None  # the `polar-mq redis-acl --tls` directory when the node speaks TLS only

    @property
    def client(self) -> redis.Redis:
        return _client(self.port, self.auth, self.tls, timeout=2)


def _client(port: int, auth: tuple[str, str] | None, tls: Path | None, timeout: float) -> redis.Redis:
    user, password = auth or (None, None)
    ssl = {"ssl": True, "ssl_ca_certs": str(tls / "ca.crt")} if tls else {}
    return redis.Redis(port=port, socket_timeout=timeout, socket_connect_timeout=timeout, username=user,
                       password=password, **ssl)


@dataclass
class SentinelCluster:
    base: Path
    nodes: list[Node] = field(default_factory=list)
    sentinels: list[Node] = field(default_factory=list)
    tls: Path | None = None

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        query = f"?ssl_ca_certs={self.tls / 'ca.crt'}" if self.tls else ""
        return f"redis+sentinel://{hosts}/{MASTER}/0{query}"

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

    def fail_over(self, r: redis.Redis, timeout: float = 30.0) -> None:
        """kill -9 the primary; `r` (a client on the cluster's URL) must write on the new one and
        read what it wrote before, within `timeout`."""
        r.set("pmq:before-failover", "1")
        old = self.kill_primary()
        deadline = time.time() + timeout
        while True:
            try:
                if r.set("pmq:after-failover", "1") and r.get("pmq:before-failover") == b"1":
                    break
            except (redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError):
                pass
            assert time.time() < deadline, "the client did not follow the failover"
            time.sleep(0.2)
        assert self.primary_port() != old.port

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
                           down_after_ms: int = 1000, acl: dict[str, str] | None = None,
                           tls: Path | None = None) -> SentinelCluster:
    """`acl`: {"file": users.acl, "replica": its password, "sentinel": its password, "admin": its
    password} from `polar-mq redis-acl --sentinel`: every data node loads the file and replicates
    as `replica`, the Sentinels watch as `sentinel` (docs/deployment.md, "Redis ACL users").
    `tls`: the directory `polar-mq redis-acl --tls` wrote (ca.crt, server.crt, server.key): data
    nodes and Sentinels listen on TLS only, and replicate and monitor over TLS."""
    base.mkdir(parents=True, exist_ok=True)
    node_auth = ("admin", acl["admin"]) if acl else None
    redis_bin, sentinel_bin = shutil.which("redis-server"), shutil.which("redis-sentinel")
    assert redis_bin and sentinel_bin, "redis-server and redis-sentinel must be installed (apt: redis-sentinel)"
    cluster = SentinelCluster(base, tls=tls)
    tls_conf = (f"tls-cert-file {tls / 'server.crt'}\ntls-key-file {tls / 'server.key'}\n"
                f"tls-ca-cert-file {tls / 'ca.crt'}\ntls-auth-clients no\ntls-replication yes\n") if tls else ""
    try:
        primary_port = 0
        for i in range(1 + replicas):
            port = free_port()
            d = base / f"redis-{port}"
            d.mkdir()
            args = [redis_bin, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                    "--dir", str(d), "--protected-mode", "no", "--repl-diskless-sync", "yes",
                    "--repl-diskless-sync-delay", "0"]
            args += ["--port", "0", "--tls-port", str(port)] if tls else ["--port", str(port)]
            conf_text = tls_conf
            if acl:  # every node: after a failover the old primary replicates too
                conf_text += f'aclfile "{acl["file"]}"\nmasteruser replica\nmasterauth "{acl["replica"]}"\n'
            if conf_text:
                conf = d / "node.conf"
                conf.write_text(conf_text)
                args.insert(1, str(conf))
            if i:
                args += ["--replicaof", "127.0.0.1", str(primary_port)]
            else:
                primary_port = port
            proc = subprocess.Popen(args, stdout=open(d / "log", "wb"), stderr=subprocess.STDOUT,
                                    start_new_session=True)
            cluster.nodes.append(Node(port, proc, node_auth, tls))
            _wait_ping(port, auth=node_auth, tls=tls)
        for _ in range(sentinels):
            port = free_port()
            conf = base / f"sentinel-{port}.conf"
            listen = f"port 0\ntls-port {port}\n{tls_conf}" if tls else f"port {port}\n"
            conf.write_text(f"{listen}bind 127.0.0.1\nprotected-mode no\ndir {base}\n"
                            f"sentinel monitor {MASTER} 127.0.0.1 {primary_port} 2\n"
                            f"sentinel down-after-milliseconds {MASTER} {down_after_ms}\n"
                            f"sentinel failover-timeout {MASTER} 10000\n"
                            f"sentinel parallel-syncs {MASTER} 2\n" +
                            (f"sentinel auth-user {MASTER} sentinel\nsentinel auth-pass {MASTER} {acl['sentinel']}\n"
                             if acl else ""))
            proc = subprocess.Popen([sentinel_bin, str(conf)], stdout=open(base / f"sentinel-{port}.log", "wb"),
                                    stderr=subprocess.STDOUT, start_new_session=True)
            cluster.sentinels.append(Node(port, proc, tls=tls))
            _wait_ping(port, tls=tls)
        cluster.wait_ready(replicas)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _wait_ping(port: int, timeout: float = 10.0, auth: tuple[str, str] | None = None,
               tls: Path | None = None) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if _client(port, auth, tls, timeout=0.5).ping():
                return
        except redis.RedisError:
            time.sleep(0.05)
    raise AssertionError(f"nothing answers on port {port}")
