"""The embedded Redis `polar-mq up` starts requires a password ($POLAR_HOME/redis.password, 0600),
binds loopback and never shows the password on a command line; a URL without it gets NOAUTH, and
every role given such a URL stops with a message that says so."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import redis
import requests

from tests.support.servers import ROOT
from polar_mq.cli.embedded_redis import ensure_redis


@pytest.fixture()
def protected(tmp_path, monkeypatch):
    monkeypatch.setenv("POLAR_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("POLAR_REDIS_URL", raising=False)
    url, server = ensure_redis()
    assert server is not None
    yield url, server, tmp_path / "home"
    server.stop()


def test_embedded_redis_needs_the_generated_password(protected):
    url, server, home = protected
    password_file = home / "redis.password"
    password = password_file.read_text().strip()
    assert stat.S_IMODE(password_file.stat().st_mode) == 0o600 and len(password) >= 32
    assert f":{password}@127.0.0.1:" in url
    bare = url.replace(f":{password}@", "")
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(bare).ping()
    host, port = bare.split("://")[1].split("/")[0].split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:  # the wire answer itself
        s.sendall(b"PING\r\n")
        assert s.recv(200).startswith(b"-NOAUTH")
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(url.replace(password, "wrong")).ping()
    r = redis.Redis.from_url(url)
    assert r.ping() and r.config_get("bind")["bind"] == "127.0.0.1"
    cmdline = Path(f"/proc/{server.process.pid}/cmdline").read_bytes()
    assert password.encode() not in cmdline  # in a 0600 config file, not on the command line


@pytest.mark.parametrize("role", [["api", "--host", "127.0.0.1", "--port", "1"],
                                  ["worker", "--stage", "init"],
                                  ["gateway", "--upstream", "http://127.0.0.1:1", "--port", "1"]])
def test_every_role_says_noauth_when_its_url_has_no_credentials(protected, role):
    url, _, home = protected
    bare = url.rpartition("@")[0].partition("://")[0] + "://" + url.rpartition("@")[2]
    env = {**os.environ, "POLAR_HOME": str(home)}
    env.pop("POLAR_REDIS_URL", None)
    args = [sys.executable, "-m", "polar_mq.cli", *role, "--redis", bare]
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "NOAUTH" in proc.stderr and "credentials" in proc.stderr, proc.stderr[-2000:]
    assert str(home / "redis.password") in proc.stderr


# ---- ACL users per role (polar-mq redis-acl, store/redis_acl.py) --------------------------------

def _wait_ping(url: str, proc: subprocess.Popen) -> redis.Redis:
    import time

    deadline = time.time() + 15
    while time.time() < deadline:
        assert proc.poll() is None, "redis-server with the generated ACL file exited"
        try:
            r = redis.Redis.from_url(url)
            r.ping()
            return r
        except redis.ConnectionError:
            time.sleep(0.1)
    raise AssertionError("redis-server with the ACL file did not answer")


@pytest.fixture(scope="module")
def acl_redis(tmp_path_factory):
    """A real redis-server loading the ACL file `polar-mq redis-acl` writes."""
    from polar_mq.cli.embedded_redis import free_port

    out = tmp_path_factory.mktemp("acl")
    port = free_port()
    cli = subprocess.run([sys.executable, "-m", "polar_mq.cli", "redis-acl", "--out", str(out),
                          "--port", str(port)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    from polar_mq.store.redis_acl import ROLES, read_env_file, url_env_name

    env = read_env_file(out / "redis.env")
    urls = {r: env[url_env_name(r)] for r in ROLES}
    assert stat.S_IMODE((out / "redis.env").stat().st_mode) == 0o600
    acl_text = (out / "users.acl").read_text()
    assert all(env[f"POLAR_REDIS_{r.upper()}_PASSWORD"] not in acl_text for r in ROLES)  # hashes only
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(out), "--aclfile", str(out / "users.acl"),
                             "--enable-debug-command", "yes"],  # so that the ACL is what refuses DEBUG
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    admin = _wait_ping(urls["admin"], proc)
    yield urls, admin, out
    proc.terminate()
    proc.wait(timeout=10)


def test_each_role_is_refused_dangerous_commands_and_foreign_keys(acl_redis):
    urls, admin, _ = acl_redis
    host, port = urls["hub"].rpartition("@")[2].split("/")[0].split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:  # the default user is off
        s.sendall(b"PING\r\n")
        assert s.recv(200).startswith(b"-NOAUTH")
    for role in ("hub", "worker", "gateway"):
        r = redis.Redis.from_url(urls[role])
        assert r.ping()
        for cmd in (("FLUSHALL",), ("FLUSHDB",), ("CONFIG", "GET", "*"), ("ACL", "LIST"), ("KEYS", "*"),
                    ("DEBUG", "SLEEP", "0"), ("SHUTDOWN",), ("MODULE", "LIST"), ("SCRIPT", "FLUSH")):
            with pytest.raises(redis.exceptions.NoPermissionError, match="no permissions to run") as err:
                r.execute_command(*cmd)
            assert cmd[0].lower() in str(err.value).lower(), (role, cmd, err.value)
        with pytest.raises(redis.exceptions.NoPermissionError, match="no permissions to access one of the keys"):
            r.set("not-polar:x", "1")  # a key outside every role's patterns
    gw = redis.Redis.from_url(urls["gateway"])
    assert gw.set("pmq:gw:session:probe", "1") and gw.exists("pmq:auth:names") == 0
    for foreign in ("pmq:task:probe", "pmq:session:probe", "_kombu.binding.init", "init"):
        with pytest.raises(redis.exceptions.NoPermissionError, match="no permissions to access one of the keys"):
            gw.set(foreign, "1")  # the gateway has no task, session or Celery key
    with pytest.raises(redis.exceptions.NoPermissionError, match="no permissions to access one of the keys"):
        gw.hset("pmq:auth:names", "x", "1")  # scoped tokens: read-only to the gateway
    assert redis.Redis.from_url(urls["worker"]).lpush("init", "x") == 1
    admin.delete("init", "pmq:gw:session:probe")


def test_the_whole_pipeline_runs_on_role_users(acl_redis, model_server, log_dir, tmp_path):
    """API (hub user), gateway (gateway user) and the three pools (worker user) complete a session
    on one Redis with the generated ACL file; no role met a NOPERM on the way (ACL LOG)."""
    from tests.support.pipeline import BorrowedRedis, agent_task, make_pipeline
    from tests.support.servers import GatewayHandle, TOKEN, spawn, start_gateway, stop
    from polar_mq.client import Client
    from polar_mq.cli.embedded_redis import free_port

    urls, admin, _ = acl_redis
    admin.execute_command("ACL", "LOG", "RESET")

    gw = start_gateway(log_dir, urls["gateway"], [model_server], name="gw-acl")
    p = api = None
    try:
        gateway = GatewayHandle(url=gw.url, upstream_url=model_server, redis_url=urls["gateway"], server=gw)
        p = make_pipeline(gateway, tmp_path, redis_server=BorrowedRedis(urls["worker"]))
        for stage in ("init", "run", "postrun"):
            p.start_worker(stage, 1)
        port = free_port()
        api = spawn([sys.executable, "-m", "polar_mq.cli", "api", "--host", "127.0.0.1", "--port", str(port),
                     "--redis", urls["hub"], "--workers", "1"], f"http://127.0.0.1:{port}/health", log_dir,
                    f"api-acl-{port}", env={**p.env, "POLAR_REDIS_URL": urls["hub"]})
        client = Client(f"http://127.0.0.1:{port}", token=TOKEN)
        sub = client.submit(agent_task(num_samples=2))
        final = client.wait(sub["task_id"], timeout=120, poll=0.5)
        assert [s["state"] for s in final["sessions"]] == ["COMPLETED", "COMPLETED"], final
        assert len(client.results(sub["task_id"])["trajectories"]) == 2
        metrics = requests.get(f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {TOKEN}"},
                               timeout=30)
        assert metrics.status_code == 200 and "polar_mq_redis_memory_bytes" in metrics.text, metrics.text[:500]
        gc = subprocess.run([sys.executable, "-m", "polar_mq.cli", "gc", "--redis", urls["hub"], "--dry-run"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert gc.returncode == 0, gc.stderr[-2000:]
        denied = admin.execute_command("ACL", "LOG")
        assert denied == [], denied  # no role was refused anything it needed
    finally:
        if api is not None:
            stop(api.proc)
        if p is not None:
            p.stop()
        stop(gw.proc)


ROLE_ARGS = {"worker": ["worker", "--stage", "init"],
             "gateway": ["gateway", "--upstream", "http://127.0.0.1:1", "--port", "1"],
             "hub": ["api", "--host", "127.0.0.1", "--port", "1"]}


def _start_role(role: str, url: str, home: Path) -> subprocess.Popen:
    env = {**os.environ, "POLAR_HOME": str(home)}
    env.pop("POLAR_REDIS_URL", None)
    return subprocess.Popen([sys.executable, "-m", "polar_mq.cli", *ROLE_ARGS[role], "--redis", url], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _refusals(acl_redis, tmp_path, noperm: list[str], noauth: list[str]) -> None:
    """Each role in `noperm` started with the gateway's user, each in `noauth` with no credentials
    (all at once): every one exits 2 with a line saying NOPERM / NOAUTH and where its URL is."""
    urls, _, _ = acl_redis
    procs = {("noperm", r): _start_role(r, urls["gateway"], tmp_path) for r in noperm}
    procs.update({("noauth", r): _start_role(r, "redis://" + urls[r].rpartition("@")[2], tmp_path) for r in noauth})
    for (kind, role), proc in procs.items():
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 2, (kind, role, err[-2000:])
        if kind == "noperm":
            assert "NOPERM" in err and f"POLAR_REDIS_URL_{role.upper()}" in err, err[-2000:]
        else:
            assert "NOAUTH" in err and "redis-acl" in err, err[-2000:]


def test_a_role_with_the_wrong_user_or_none_says_so(acl_redis, tmp_path):
    """A worker handed the gateway's user stops at start with NOPERM naming the URL it should have
    (`polar-mq redis-acl`'s POLAR_REDIS_URL_WORKER); the gateway without credentials: NOAUTH."""
    _refusals(acl_redis, tmp_path, noperm=["worker"], noauth=["gateway"])


@pytest.mark.full
def test_every_role_with_the_wrong_user_or_none_says_so(acl_redis, tmp_path):
    _refusals(acl_redis, tmp_path, noperm=["worker", "hub"], noauth=["worker", "gateway", "hub"])


@pytest.mark.full
def test_roles_speak_tls_to_a_redis_with_the_generated_ca(tmp_path, model_server, log_dir):
    """`polar-mq redis-acl --tls`: redis-server on its TLS port only, with the ACL file; the
    hub's Celery producer, a worker's store and the gateway (its own wire client) all work over
    the rediss:// URLs, and a plain redis:// connection gets nothing."""
    from polar_mq.cli.embedded_redis import credentials_problem, free_port
    from polar_mq.settings import PipelineSettings
    from polar_mq.store.redis_acl import ROLES, read_env_file, url_env_name
    from polar_mq.tasks.app.celery import make_celery
    from polar_mq.tasks.app.routing import INIT_TASK
    from tests.support.servers import AUTH, start_gateway, stop

    port = free_port()
    cli = subprocess.run([sys.executable, "-m", "polar_mq.cli", "redis-acl", "--out", str(tmp_path), "--tls",
                          "--port", str(port)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr
    env = read_env_file(tmp_path / "redis.env")
    urls = {r: env[url_env_name(r)] for r in ROLES}
    assert all(u.startswith("rediss://") and "ssl_ca_certs=" in u for u in urls.values())
    tls = tmp_path / "tls"
    proc = subprocess.Popen(["redis-server", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
                             "--tls-cert-file", str(tls / "server.crt"), "--tls-key-file", str(tls / "server.key"),
                             "--tls-ca-cert-file", str(tls / "ca.crt"), "--tls-auth-clients", "no",
                             "--save", "", "--dir", str(tmp_path), "--aclfile", str(tmp_path / "users.acl")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    gw = None
    try:
        admin = _wait_ping(urls["admin"], proc)
        with pytest.raises(redis.ConnectionError):
            redis.Redis.from_url(urls["admin"].replace("rediss://", "redis://").split("?")[0],
                                 socket_timeout=2).ping()  # plain text on the TLS port: no answer
        for role in ("hub", "worker", "gateway"):
            assert credentials_problem(urls[role], role=role) is None
        make_celery(PipelineSettings(redis_url=urls["hub"])).send_task(INIT_TASK, args=["tls-probe"], queue="init")
        assert admin.llen("init") == 1
        gw = start_gateway(log_dir, urls["gateway"], [model_server], name="gw-tls")
        sess = requests.post(f"{gw.url}/sessions", json={}, headers=AUTH, timeout=30)
        assert sess.status_code in (200, 201), sess.text
        chat = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi polar:notool"}]}
        for _ in range(3):
            assert requests.post(f"{sess.json()['base_urls']['openai']}/chat/completions", json=chat,
                                 timeout=30).ok
        calls = requests.get(f"{gw.url}/sessions/{sess.json()['session_id']}/calls", headers=AUTH, timeout=10)
        assert len(calls.json()["calls"]) == 3
        assert admin.execute_command("ACL", "LOG") == []
    finally:
        if gw is not None:
            stop(gw.proc)
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.full
def test_sentinel_with_acl_users_follows_a_failover(tmp_path):
    """`polar-mq redis-acl --sentinel`: data nodes load the ACL file and replicate as `replica`, the
    Sentinels watch as `sentinel`; the worker's redis+sentinel:// URL works, is refused FLUSHALL,
    and follows a failover."""
    from tests.support.sentinel import MASTER, start_sentinel_cluster
    from polar_mq.store.redis_acl import generate
    from polar_mq.store.redis_url import client

    gen = generate(tmp_path / "acl", sentinel=True, environ={})
    cluster = start_sentinel_cluster(tmp_path / "c", replicas=1, acl={
        "file": str(gen.acl_file), "replica": gen.passwords["replica"], "sentinel": gen.passwords["sentinel"],
        "admin": gen.passwords["admin"]})
    try:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in cluster.sentinels)
        r = client(f"redis+sentinel://worker:{gen.passwords['worker']}@{hosts}/{MASTER}/0", socket_timeout=2)
        assert r.set("pmq:before", "1")
        with pytest.raises(redis.exceptions.NoPermissionError):
            r.flushall()
        cluster.fail_over(r)
    finally:
        cluster.stop()
