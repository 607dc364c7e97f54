"""Retention for weeks-long runs: a finished task's keys expire after its results are exported,
`polar-mq gc` expires (or deletes) finished tasks nobody exported, /metrics shows Redis memory.

One Redis for the pipeline and its gateway, as `polar-mq up` and the compose file run them, and
a gateway with a Redis of its own (POLAR_GATEWAY_REDIS_URL, `gc --gateway-redis`); real gateway,
API, Celery workers and redis-server processes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import redis
import requests

from tests.support.servers import AUTH, GatewayHandle, spawn, start_gateway, stop
from tests.support.pipeline import BorrowedRedis, ROOT, TINY_AGENT, agent_task, make_pipeline
from polar_mq import states
from polar_mq.store import retention
from polar_mq.cli.embedded_redis import start_embedded
from polar_mq.store.core import Keys
from polar_mq.cli.up import free_port


@pytest.fixture(scope="module")
def env(log_dir, model_server, tmp_path_factory):
    server = start_embedded()
    gw = start_gateway(log_dir, server.url, [model_server], name="gw-retention")
    gateway = GatewayHandle(url=gw.url, upstream_url=model_server, redis_url=server.url, server=gw)
    p = make_pipeline(gateway, tmp_path_factory.mktemp("retention"), redis_server=BorrowedRedis(server.url),
                      POLAR_RETENTION_SECONDS="5000", POLAR_KEEP_WORKDIRS="0")
    for stage in ("init", "run", "postrun"):
        p.start_worker(stage, 1)
    port = free_port()
    api = spawn([sys.executable, "-m", "polar_mq.cli", "api", "--host", "127.0.0.1", "--port", str(port),
                 "--redis", server.url, "--workers", "1"], f"http://127.0.0.1:{port}/health", log_dir,
                f"api-retention-{port}", env={**p.env, "POLAR_API_TOKEN": ""})
    yield p, gateway, f"http://127.0.0.1:{port}", redis.Redis.from_url(server.url)
    stop(api.proc)
    p.stop()
    stop(gw.proc)
    server.stop()


def run_task(p, n: int = 2) -> tuple[str, list]:
    tid, sids = p.submit(agent_task(num_samples=n, timeout_seconds=60))
    recs = p.wait(sids, timeout=90)
    assert all(r.state == states.COMPLETED for r in recs), [(r.state, r.error) for r in recs]
    return tid, recs


def ttls(r: redis.Redis, tid: str) -> dict[str, int]:
    return {k: r.ttl(k) for k in retention.task_keys(r, Keys(), tid)}


def test_export_gives_every_key_of_the_task_its_retention(env):
    p, gateway, api, r = env
    tid, recs = run_task(p)
    before = ttls(r, tid)
    assert before and all(t == -1 for t in before.values())  # nothing expires before the export
    gw_keys = [k for k in before if ":gw:" in k]
    assert any(":gw:chunks:" in k for k in gw_keys) and any(":gw:key:" in k for k in gw_keys)
    assert requests.get(f"{api}/v1/tasks/{tid}/results", headers=AUTH, timeout=10).status_code == 200
    after = ttls(r, tid)
    assert set(after) == set(before) | {Keys().task_exported(tid)}
    assert all(4000 < t <= 5000 for t in after.values()), after
    # the session's work dir went after postrun; its logs stay until gc prunes the task
    sdir = recs[0].runtime.session_dir
    assert sorted(p.name for p in __import__("pathlib").Path(sdir).iterdir()) == ["logs"]


def test_gc_expires_unexported_finished_tasks_and_deletes_on_request(env):
    p, gateway, api, r = env
    tid, recs = run_task(p, 1)
    keys = Keys()
    cmd = [sys.executable, "-m", "polar_mq.cli", "gc", "--redis", gateway.redis_url, "--older-than", "0"]
    dry = json.loads(subprocess.run(cmd + ["--dry-run"], capture_output=True, text=True, cwd=ROOT, check=True,
                                    env={**p.env}).stdout)
    assert dry["expiring"] >= 1 and all(t == -1 for t in ttls(r, tid).values())
    out = json.loads(subprocess.run(cmd + ["--retention", "777"], capture_output=True, text=True, cwd=ROOT,
                                    check=True, env={**p.env}).stdout)
    assert out["expiring"] >= 1
    assert all(0 < t <= 777 for t in ttls(r, tid).values())
    out = json.loads(subprocess.run(cmd + ["--delete"], capture_output=True, text=True, cwd=ROOT, check=True,
                                    env={**p.env}).stdout)
    assert out["deleted"] >= 1 and out["dirs_pruned"] >= 1
    assert retention.task_keys(r, keys, tid) == []
    assert r.zscore(keys.task_index(), tid) is None
    gw_sid = recs[0].gateway_session_id
    assert not r.exists(keys.calls(gw_sid)) and not r.exists(keys.call_chunks(gw_sid))
    assert requests.get(f"{api}/v1/tasks/{tid}", headers=AUTH, timeout=10).status_code == 404


def test_unfinished_tasks_are_never_collected(env):
    p, gateway, api, r = env
    tid, sids = p.submit(agent_task(num_samples=1, timeout_seconds=60,
                                    agent={"harness": "shell", "options": {"command": "sleep 6"}}))
    report = retention.gc(r, Keys(), retention=10, older_than=0, delete=True)
    assert tid not in report.deleted and r.exists(Keys().task(tid))
    assert not retention.mark_exported(r, Keys(), tid, 100)
    p.wait(sids, timeout=60)


def test_metrics_show_redis_memory(env):
    _, _, api, _ = env
    text = requests.get(f"{api}/metrics", headers=AUTH, timeout=10).text
    used = [line for line in text.splitlines() if line.startswith('polar_mq_redis_memory_bytes{kind="used"}')]
    assert used and int(used[0].split()[-1]) > 100_000
    assert 'polar_mq_redis_memory_bytes{kind="maxmemory"}' in text


def test_trainer_ack_starts_the_retention_too(env):
    p, gateway, api, r = env
    tid, _ = run_task(p, 1)
    assert all(t == -1 for t in ttls(r, tid).values())
    resp = requests.post(f"{api}/v1/groups/{tid}/ack", headers=AUTH, json={}, timeout=10)
    assert resp.status_code == 200, resp.text
    after = ttls(r, tid)
    assert any(":group:" in k for k in after) and all(4000 < t <= 5000 for t in after.values()), after


# --- the gateway with a Redis of its own ---------------------------------------------------------
@pytest.fixture(scope="module")
def split_env(log_dir, model_server, tmp_path_factory):
    """Pipeline and API on one Redis, the gateway on another (POLAR_GATEWAY_REDIS_URL)."""
    pipeline_redis, gateway_redis = start_embedded(), start_embedded()
    gw = start_gateway(log_dir, gateway_redis.url, [model_server], name="gw-retention-split")
    gateway = GatewayHandle(url=gw.url, upstream_url=model_server, redis_url=gateway_redis.url, server=gw)
    p = make_pipeline(gateway, tmp_path_factory.mktemp("retention-split"), redis_server=BorrowedRedis(pipeline_redis.url),
                      POLAR_RETENTION_SECONDS="5000", POLAR_GATEWAY_REDIS_URL=gateway_redis.url)
    for stage in ("init", "run", "postrun"):
        p.start_worker(stage, 1)
    port = free_port()
    api = spawn([sys.executable, "-m", "polar_mq.cli", "api", "--host", "127.0.0.1", "--port", str(port),
                 "--redis", pipeline_redis.url, "--workers", "1"], f"http://127.0.0.1:{port}/health", log_dir,
                f"api-retention-split-{port}", env={**p.env, "POLAR_API_TOKEN": ""})
    yield (p, f"http://127.0.0.1:{port}", redis.Redis.from_url(pipeline_redis.url),
           redis.Redis.from_url(gateway_redis.url))
    stop(api.proc)
    p.stop()
    stop(gw.proc)
    pipeline_redis.stop()
    gateway_redis.stop()


def test_retention_and_gc_reach_the_gateways_own_redis(split_env):
    p, api, r, g = split_env
    keys = Keys()
    tid, recs = run_task(p, 2)
    here, there = retention.owned_keys(r, keys, tid, g)
    gw_sids = [rec.gateway_session_id for rec in recs]
    assert all(keys.calls(s) in there and keys.call_chunks(s) in there for s in gw_sids), there
    assert not any(":gw:" in k for k in here) and not any(r.exists(keys.calls(s)) for s in gw_sids)
    assert all(t == -1 for k in there for t in [g.ttl(k)])
    # export through the API: both servers' keys get the retention
    assert requests.get(f"{api}/v1/tasks/{tid}/results", headers=AUTH, timeout=10).status_code == 200
    assert all(4000 < r.ttl(k) <= 5000 for k in here)
    assert all(4000 < g.ttl(k) <= 5000 for k in there), {k: g.ttl(k) for k in there}
    text = requests.get(f"{api}/metrics", headers=AUTH, timeout=10).text
    assert 'polar_mq_gateway_redis_memory_bytes{kind="used"}' in text

    # gc --delete with both URLs removes the gateway's records too, and reports both servers
    tid2, recs2 = run_task(p, 1)
    _, there2 = retention.owned_keys(r, keys, tid2, g)
    assert there2
    out = json.loads(subprocess.run(
        [sys.executable, "-m", "polar_mq.cli", "gc", "--redis", p.redis_url, "--gateway-redis",
         p.env["POLAR_GATEWAY_REDIS_URL"], "--older-than", "0", "--delete"],
        capture_output=True, text=True, cwd=ROOT, check=True, env={**p.env}).stdout)
    assert out["deleted"] >= 2 and "gateway_freed_bytes" in out
    assert not any(g.exists(k) for k in there2)
    assert retention.task_keys(r, keys, tid2, g) == []


def test_gc_collects_orphan_gateway_sessions_by_hand(env):
    """`polar-mq gc` runs the janitor's orphan step by hand (retention.collect_orphan_sessions), and
    puts sessions the index does not know (made before it existed) into it first."""
    p, gateway, api, r = env
    keys = Keys()
    made = requests.post(f"{gateway.url}/sessions", json={}, headers=AUTH, timeout=10).json()
    sid = made["session_id"]
    resp = requests.post(f"{made['base_urls']['openai']}/chat/completions", timeout=30,
                         headers={"Authorization": f"Bearer {made['key']}"},
                         json={"model": "policy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert resp.status_code == 200
    tid, recs = run_task(p, 1)  # a finished task: its gateway session is the task's, never an orphan
    r.zrem(keys.gateway_sessions_index(), sid)  # as if made before the index existed
    cmd = [sys.executable, "-m", "polar_mq.cli", "gc", "--redis", gateway.redis_url, "--older-than", "0"]
    out = json.loads(subprocess.run(cmd + ["--retention", "900"], capture_output=True, text=True, cwd=ROOT,
                                    check=True, env={**p.env}).stdout)
    mine = [k.decode() for k in r.scan_iter(count=1000) if sid in k.decode() or made["key"] in k.decode()]
    assert {keys.gateway_session(sid), keys.gateway_key(made["key"]), keys.calls(sid)} <= set(mine)
    assert out["sessions_indexed"] >= 1 and out["orphan_sessions"] >= 1 and out["orphan_keys"] >= len(mine), out
    assert all(0 < r.ttl(k) <= 900 for k in mine), {k: r.ttl(k) for k in mine}
    task_gw = recs[0].gateway_session_id
    assert r.exists(keys.calls(task_gw)) and r.ttl(keys.gateway_session(task_gw)) > 800  # the task's TTL, from gc
    subprocess.run(cmd + ["--delete"], capture_output=True, text=True, cwd=ROOT, check=True, env={**p.env})
    assert not any(sid in k.decode() or made["key"] in k.decode() for k in r.scan_iter(count=1000))
    assert r.zscore(keys.gateway_sessions_index(), sid) is None


def test_late_task_keys_follow_the_tasks_ttl_and_gone_tasks_leave_nothing():
    """A callback's state written after the export gets the task's TTL; once a task's record is
    gone, the janitor's pass drops its index entries and task-level leftovers, but a task created
    again under the same id keeps everything."""
    from polar_mq.store.pipeline import PipelineStore
    from polar_mq.store.core import connect

    server = start_embedded()
    try:
        store = PipelineStore(connect(server.url))
        r, keys = store.r, store.keys
        r.set(keys.task("t-late"), b"x", ex=500)  # exported: the task expires in 500 s
        store.record_callback("t-late", "d1", {"state": "delivered"})
        assert store.mark_callback_sent("t-late")
        assert 0 < r.ttl(keys.task_callbacks("t-late")) <= 500 and 0 < r.ttl(keys.callbacks_done("t-late")) <= 500
        # t-gone: its record expired, a late key and its index entries stayed; t-back: same story,
        # but the id was submitted again meanwhile (its record exists): untouched.
        for t in ("t-gone", "t-back"):
            r.zadd(keys.task_index(), {t: 1.0})
            r.zadd(keys.groups_pending(), {t: 1.0})
            r.hset(keys.task_callbacks(t), "d", "{}")
        r.set(keys.task("t-back"), b"again")
        got = retention.collect(r, keys, retention=60)
        assert got.index_dropped == 1 and got.tasks == []
        assert not r.exists(keys.task_callbacks("t-gone")) and r.zscore(keys.task_index(), "t-gone") is None
        assert r.zscore(keys.groups_pending(), "t-gone") is None
        assert r.exists(keys.task_callbacks("t-back")) and r.zscore(keys.task_index(), "t-back") == 1.0
        retention._forget(r, keys, ["t-back"])  # seen gone, then created again before the delete
        assert r.exists(keys.task_callbacks("t-back")) and r.zscore(keys.task_index(), "t-back") == 1.0
    finally:
        server.stop()


def test_janitor_pass_reaches_the_gateways_own_redis(split_env):
    """With POLAR_GATEWAY_REDIS_URL the janitor's pass finds orphan sessions in the gateway's Redis
    and asks the pipeline's whether their task exists."""
    p, api, r, g = split_env
    keys = Keys()
    gw_url = p.gateway_url
    orphan = requests.post(f"{gw_url}/sessions", json={}, headers=AUTH, timeout=10).json()
    owned = requests.post(f"{gw_url}/sessions", json={"task_id": "split-live"}, headers=AUTH, timeout=10).json()
    r.set(keys.task("split-live"), b"x")  # a task of the pipeline (its Redis, not the gateway's)
    try:
        got = retention.collect(r, keys, retention=5, now=time.time() + 10, gw=g)
        assert orphan["session_id"] in got.sessions and owned["session_id"] not in got.sessions
        assert not g.exists(keys.gateway_session(orphan["session_id"])) and not g.exists(keys.gateway_key(orphan["key"]))
        assert g.exists(keys.gateway_session(owned["session_id"])) and g.exists(keys.gateway_key(owned["key"]))
    finally:
        r.delete(keys.task("split-live"))
