"""Redis with Sentinel: `redis+sentinel://` URLs for every role, and a failover mid-run.

A real primary, two replicas and three redis-sentinel processes on loopback; the gateway and the
three worker pools get the Sentinel URL. kill -9 of the primary while the sessions run: every
session COMPLETES exactly once (one harness run each), every model call is in its trajectory,
and the time to the first write on the new primary is measured (printed, docs/deployment.md)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import redis

from tests.support.servers import start_gateway, stop
from tests.support.pipeline import TINY_AGENT, agent_task, make_pipeline
from polar_mq import states
from polar_mq.store.redis_url import CeleryBroker, RedisURLError, celery_broker, client, parse_sentinel, uses_sentinel
from polar_mq.store.core import connect
from tests.support.sentinel import MASTER, start_sentinel_cluster

SLOW_AGENT = (f'echo "start $$ $(date +%s.%N)" >> ../marks; {sys.executable} {TINY_AGENT}; sleep 4; '
              f'echo "end $$ $(date +%s.%N)" >> ../marks')


def test_sentinel_url_parts():
    p = parse_sentinel("redis+sentinel://u:s%40cret@h1:26379,h2:26380/mymaster/2")
    assert p.sentinels == [("h1", 26379), ("h2", 26380)] and p.master == "mymaster" and p.db == 2
    assert (p.username, p.password) == ("u", "s@cret")
    p = parse_sentinel("redis+sentinel://:pw@h1,h2:1/m/0")
    assert p.sentinels == [("h1", 26379), ("h2", 1)] and p.username is None and p.password == "pw"
    for bad in ("redis+sentinel://h1:1", "redis+sentinel:///m/0", "redis+sentinel://h1:x/m/0",
                "redis+sentinel://h1:1/m/zero"):
        with pytest.raises(RedisURLError):
            parse_sentinel(bad)
    b = celery_broker("redis+sentinel://:pw@h1:1,h2:2/m/3")
    assert b.url == "sentinel://:pw@h1:1/3;sentinel://:pw@h2:2/3" and b.transport_options == {"master_name": "m"}
    assert b.use_ssl is None
    assert celery_broker("redis://h:1/0") == CeleryBroker("redis://h:1/0")


def test_sentinel_url_tls_options():
    """TLS comes from the query (any ssl_* option implies it; the Sentinels follow unless
    sentinel_ssl=false); an option this module does not know is an error, never dropped."""
    p = parse_sentinel("redis+sentinel://h1/m/0?ssl_ca_certs=/ca.crt&ssl_check_hostname=false")
    assert p.ssl and p.sentinel_ssl
    assert p.ssl_options == {"ssl_ca_certs": "/ca.crt", "ssl_check_hostname": False}
    p = parse_sentinel("redis+sentinel://h1/m/0?ssl=true&sentinel_ssl=false")
    assert p.ssl and not p.sentinel_ssl and p.ssl_options == {}
    assert not parse_sentinel("redis+sentinel://h1/m/0").ssl
    for bad in ("redis+sentinel://h1/m/0?ssl=maybe", "redis+sentinel://h1/m/0?ssl=false&ssl_ca_certs=/x",
                "redis+sentinel://h1/m/0?sslcacerts=/x", "redis+sentinel://h1/m/0?socket_timeout=1"):
        with pytest.raises(RedisURLError):
            parse_sentinel(bad)
    b = celery_broker("redis+sentinel://h1:1/m/0?ssl_ca_certs=/ca.crt&sentinel_password=sp")
    assert b.use_ssl == {"ssl_cert_reqs": "required", "ssl_ca_certs": "/ca.crt"}
    assert b.transport_options["sentinel_kwargs"] == {"password": "sp", "ssl": True, "ssl_ca_certs": "/ca.crt"}


def test_tls_sentinels_and_primary_follow_a_failover(tmp_path, model_server, log_dir):
    """Data nodes and Sentinels on TLS only (certificates from `polar-mq redis-acl --tls`): the
    client, a Celery producer and the gateway (its own wire client) work over
    `redis+sentinel://...?ssl_ca_certs=CA` and follow a failover; the same URL without TLS gets
    no answer."""
    import requests

    from tests.support.servers import AUTH
    from polar_mq.cli.redis_acl import make_tls
    from polar_mq.settings import PipelineSettings
    from polar_mq.tasks.app.celery import make_celery
    from polar_mq.tasks.app.routing import INIT_TASK

    tls = make_tls(tmp_path / "acl", ["127.0.0.1"])
    cluster = start_sentinel_cluster(tmp_path / "sentinel", replicas=1, tls=tls)
    gw = None
    chat = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi polar:notool"}]}
    try:
        r = client(cluster.url, socket_timeout=2)
        gw = start_gateway(log_dir, cluster.url, [model_server], name="gw-sentinel-tls")
        sess = requests.post(f"{gw.url}/sessions", json={}, headers=AUTH, timeout=30).json()
        assert requests.post(f"{sess['base_urls']['openai']}/chat/completions", json=chat, timeout=30).ok
        assert r.set("pmq:before", "1")
        make_celery(PipelineSettings(redis_url=cluster.url)).send_task(INIT_TASK, args=["tls-probe"], queue="init")
        assert r.llen("init") == 1
        with pytest.raises(redis.ConnectionError):
            client(cluster.url.split("?")[0], socket_timeout=1, socket_connect_timeout=1).ping()
        cluster.fail_over(r)
        make_celery(PipelineSettings(redis_url=cluster.url)).send_task(INIT_TASK, args=["tls-probe-2"], queue="init")
        assert r.llen("init") == 2
        for _ in range(100):  # the gateway's pooled connections met the dead primary: re-resolved
            if requests.post(f"{sess['base_urls']['openai']}/chat/completions", json=chat, timeout=30).ok:
                break
            time.sleep(0.2)
        calls = requests.get(f"{gw.url}/sessions/{sess['session_id']}/calls", headers=AUTH, timeout=10).json()
        assert len(calls["calls"]) == 2
    finally:
        if gw is not None:
            stop(gw.proc)
        cluster.stop()


def _run_failover(gateway_upstream: str, log_dir: Path, tmp_path: Path, sessions: int) -> None:
    cluster = start_sentinel_cluster(tmp_path / "sentinel")
    gw = p = None
    try:
        r = client(cluster.url)
        assert uses_sentinel(r) and r.ping()
        gw = start_gateway(log_dir, cluster.url, [gateway_upstream], name="gateway-sentinel")

        class _GW:
            url = gw.url

        # The lease outlives the failover (a holder fences itself after 0.6 TTL without Redis).
        p = make_pipeline(_GW, tmp_path, redis_server=cluster, POLAR_LEASE_TTL="10",
                          POLAR_READY_CAPACITY=str(sessions))
        p.start_worker("init", 2)
        p.start_worker("run", sessions)
        p.start_worker("postrun", 2)
        _, sids = p.submit(agent_task(num_samples=sessions, timeout_seconds=180,  # a failover on a busy host
                                      agent={"harness": "shell", "options": {"command": SLOW_AGENT}}))
        deadline = time.time() + 60
        while time.time() < deadline:
            running = [s for s in p.store.get_sessions(sids) if s.state == states.RUNNING]
            if len(running) >= max(1, sessions // 2):
                break
            time.sleep(0.1)
        assert running, "no session reached RUNNING"
        old = cluster.kill_primary()
        killed = time.time()
        probe = connect(cluster.url, ride_out_outages=60)
        probe.set("polar:probe:first-write", repr(killed))
        first_write = time.time() - killed
        assert cluster.primary_port() != old.port
        recs = p.wait(sids, timeout=180)
        done = time.time() - killed
        print(f"\nsentinel failover: first write on the new primary {first_write:.2f} s after kill -9; "
              f"{sessions} sessions finished {done:.1f} s after it")
        for rec in recs:
            assert rec.state == states.COMPLETED, (rec.session_id, rec.state, rec.error)
            assert sum(h[0] in states.TERMINAL for h in rec.history) == 1
            lines = [ln for ln in (Path(rec.runtime.session_dir) / "marks").read_text().split("\n") if ln]
            assert sum(ln.startswith("start") for ln in lines) == 1, lines  # never run twice
            assert sum(ln.startswith("end") for ln in lines) == 1, lines
            traj = p.store.get_trajectory(rec.session_id)
            assert traj.status == "COMPLETED" and traj.stats["calls"] == 2, traj.stats
        assert len({r.session_id for r in recs}) == sessions
        # State changes, group acks and gateway records waited for a replica (replicated.py).
        assert cluster.primary().client.info("commandstats")["cmdstat_wait"]["calls"] > 0
    finally:
        if p is not None:
            p.stop()
        else:
            cluster.stop()
        if gw is not None:
            stop(gw.proc)


def test_failover_mid_run_loses_nothing(model_server, log_dir, tmp_path):
    _run_failover(model_server, log_dir, tmp_path, sessions=8)


@pytest.mark.full
def test_failover_mid_run_32_sessions(model_server, log_dir, tmp_path):
    _run_failover(model_server, log_dir, tmp_path, sessions=32)


def test_wrong_master_name_is_a_clear_error(tmp_path):
    cluster = start_sentinel_cluster(tmp_path / "s", replicas=1)
    try:
        url = cluster.url.replace(f"/{MASTER}/", "/nosuch/")
        with pytest.raises(redis.ConnectionError, match="nosuch"):
            client(url, socket_timeout=1).ping()
    finally:
        cluster.stop()


def test_compose_sentinel_variant_points_every_role_at_the_sentinels():
    import json
    import os
    import subprocess

    from tests.support.servers import ROOT
    from tests.deploy.test_deploy import compose_binary

    out = subprocess.run([compose_binary(), "-f", str(ROOT / "compose" / "docker-compose.yml"),
                          "-f", str(ROOT / "compose" / "sentinel.yml"), "config", "--format", "json"],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "POLAR_TOKEN_FILE": str(ROOT / "README.md")})
    assert out.returncode == 0, out.stderr
    services = json.loads(out.stdout)["services"]
    assert {"sentinel-1", "sentinel-2", "sentinel-3", "redis-replica-1", "redis-replica-2"} <= set(services)
    for name in ("api", "gateway", "worker_init", "worker_run", "worker_postrun", "flower"):
        url = services[name]["environment"]["POLAR_REDIS_URL"]
        p = parse_sentinel(url)
        assert p.master == "polar" and len(p.sentinels) == 3, (name, url)


def test_up_api_and_cli_on_a_sentinel_url(tmp_path):
    """`polar-mq up --redis redis+sentinel://...`: the API, gateway and pools it starts and the
    CLI's cluster view all reach the primary through the Sentinels (no embedded Redis started)."""
    import subprocess

    from tests.support.pipeline import TINY_AGENT as agent
    from tests.deploy.test_up_durable import Up
    from polar_mq.cli.embedded_redis import free_port

    cluster = start_sentinel_cluster(tmp_path / "s", replicas=1)
    up = Up(tmp_path, tmp_path / "home", free_port(), free_port())
    try:
        api = up.start("--redis", cluster.url)
        sub = api.submit({"instruction": "Write hello into polar.txt", "num_samples": 2,
                          "agent": {"harness": "shell", "options": {"command": [sys.executable, str(agent)]}}})
        assert [s["state"] for s in api.wait(sub["task_id"], timeout=120)["sessions"]] == ["COMPLETED"] * 2
        assert cluster.primary().client.exists(*cluster.primary().client.keys("*task*")) > 0
        out = subprocess.run([sys.executable, "-m", "polar_mq.cli", "status", "--cluster", "--json",
                              "--redis", cluster.url], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and '"alive": true' in out.stdout, out.stderr[-2000:]
        assert not (tmp_path / "home" / "redis").exists()  # nothing embedded
    finally:
        up.stop()
        cluster.stop()


# a script that holds the server for a second (DEBUG SLEEP is disabled in redis-server 7)
BUSY_SECOND = """local t0 = redis.call('TIME')
repeat local t = redis.call('TIME') until (t[1] - t0[1]) * 1000000 + (t[2] - t0[2]) > 1000000
return 1"""


def test_a_connection_cut_mid_command_follows_the_new_primary(tmp_path):
    """A command in flight when the primary dies is retried on the NEW primary: redis-py's send
    path reconnects with `connect_check_health`, whose retries kept the dead primary's address
    for the whole ride-out budget (a run stage's transition then failed 60 s later and the janitor
    ran its session again). `redis_url.FollowingConnection` resolves the primary on every try."""
    import threading

    cluster = start_sentinel_cluster(tmp_path / "sentinel")
    try:
        r = connect(cluster.url, ride_out_outages=30)
        r.set("k", "before")
        done: dict = {}

        def in_flight() -> None:  # the reply never comes from the old primary
            t0 = time.time()
            with r.pipeline(transaction=False) as pipe:
                pipe.eval(BUSY_SECOND, 0)
                pipe.set("k", "after")
                done["result"] = pipe.execute(raise_on_error=False)
            done["took"] = time.time() - t0

        t = threading.Thread(target=in_flight)
        t.start()
        time.sleep(0.3)
        old = cluster.kill_primary()
        t.join(60)
        assert "took" in done and done["took"] < 15, done
        assert cluster.primary_port() != old.port, done
        assert r.get("k") == b"after"
    finally:
        cluster.stop()
