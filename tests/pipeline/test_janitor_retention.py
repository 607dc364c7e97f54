"""The janitor collects on its own (store/retention.py `collect`, tasks/worker/retention_sweep.py):
a finished task nobody exported or acked, and an orphan gateway session (created directly with
`POST /sessions`, no task) idle past POLAR_RETENTION_SECONDS, go with every key they own (records,
chunks, key mapping, flags, trajectories, the rubric judge's session), counted in /metrics; a live
task, a session of a live task and a session in use are not touched. An exported task's keys,
its judge session's included, get the retention TTL instead.

Real redis-server, gateway, Celery workers, API and the stand-in model server (as agent and judge).
"""

from __future__ import annotations

import json
import sys
import threading
import time

import pytest
import redis
import requests

from tests.support.pipeline import BorrowedRedis, agent_task, make_pipeline
from tests.support.servers import AUTH, GatewayHandle, spawn, start_gateway, stop
from polar_mq import states
from polar_mq.cli.embedded_redis import start_embedded
from polar_mq.cli.up import free_port
from polar_mq.store import retention
from polar_mq.store.core import Keys

RETENTION = 6  # seconds: POLAR_RETENTION_SECONDS of this module's pipeline and API
SCORES = {"scores": {"overall": 0.5}, "explanation": "fine"}


@pytest.fixture(scope="module")
def env(log_dir, model_server, tmp_path_factory):
    server = start_embedded()
    gw = start_gateway(log_dir, server.url, [model_server], name="gw-janitor")
    gateway = GatewayHandle(url=gw.url, upstream_url=model_server, redis_url=server.url, server=gw)
    p = make_pipeline(gateway, tmp_path_factory.mktemp("janitor"), redis_server=BorrowedRedis(server.url),
                      POLAR_RETENTION_SECONDS=str(RETENTION), POLAR_RETENTION_SWEEP_SECONDS="1",
                      POLAR_KEEP_WORKDIRS="0")
    p.start_worker("init", 2)
    p.start_worker("run", 2)
    p.start_worker("postrun", 1)
    port = free_port()
    api = spawn([sys.executable, "-m", "polar_mq.cli", "api", "--host", "127.0.0.1", "--port", str(port),
                 "--redis", server.url, "--workers", "1"], f"http://127.0.0.1:{port}/health", log_dir,
                f"api-janitor-{port}", env=p.env)
    yield p, gateway, f"http://127.0.0.1:{port}", redis.Redis.from_url(server.url)
    stop(api.proc)
    p.stop()
    stop(gw.proc)
    server.stop()


def keys_naming(r: redis.Redis, *ids: str) -> list[str]:
    """Every key in Redis whose name holds one of the ids (whatever module wrote it)."""
    return sorted(k.decode() for k in r.scan_iter(count=1000) if any(i in k.decode() for i in ids))


def metric(api: str, name: str) -> float:
    text = requests.get(f"{api}/metrics", headers=AUTH, timeout=10).text
    found = [line for line in text.splitlines() if line.startswith(name + " ")]
    assert found, f"{name} not in /metrics"
    return float(found[0].split()[-1])


def session(gateway, **body) -> dict:
    resp = requests.post(f"{gateway.url}/sessions", json=body, headers=AUTH, timeout=10)
    assert resp.status_code == 201, resp.text
    return resp.json()


def chat(s: dict) -> requests.Response:
    return requests.post(f"{s['base_urls']['openai']}/chat/completions", timeout=30,
                         headers={"Authorization": f"Bearer {s['key']}"},
                         json={"model": "policy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})


def rubric_task(task_id: str) -> dict:
    return agent_task(task_id=task_id, num_samples=1, grader={"strategy": "rubric", "config": {
        "rubric": f"The file must hold the greeting. polar:say={json.dumps(SCORES)}"}})


def test_janitor_collects_unexported_tasks_and_orphan_sessions_only(env):
    p, gateway, api, r = env
    keys = Keys()
    assert metric(api, "polar_mq_janitor_collected_tasks_total") == 0  # shown before the first
    # A live task: its session sleeps through the whole collection.
    live, [live_sid] = p.submit(agent_task(num_samples=1, timeout_seconds=90,
                                           agent={"harness": "shell", "options": {"command": "sleep 60"}}))
    # Two finished rubric tasks: one exported (TTL), one nobody exports (collected).
    done, [done_sid] = p.submit(rubric_task("janitor-unexported"))
    kept, [kept_sid] = p.submit(rubric_task("janitor-exported"))
    recs = p.wait([done_sid, kept_sid], timeout=120)
    assert all(rec.state == states.COMPLETED for rec in recs), [(rec.state, rec.error) for rec in recs]
    judge = retention.judge_session_id(done_sid)
    owned = retention.task_keys(r, keys, done)
    assert keys.calls(judge) in owned and keys.calls(recs[0].gateway_session_id) in owned, owned
    assert all(r.ttl(k) == -1 for k in owned)

    # Exported: every key of the task, the judge's session included, gets the retention.
    assert requests.get(f"{api}/v1/tasks/{kept}/results", headers=AUTH, timeout=10).status_code == 200
    exported = retention.task_keys(r, keys, kept)
    assert keys.calls(retention.judge_session_id(kept_sid)) in exported
    assert all(0 < r.ttl(k) <= RETENTION for k in exported), {k: r.ttl(k) for k in exported}

    # Gateway sessions: an orphan used once, one kept in use, one of the live task.
    orphan = session(gateway, metadata={"who": "a notebook"})
    assert chat(orphan).status_code == 200
    busy = session(gateway)
    of_live = session(gateway, task_id=live)
    stop_busy = threading.Event()

    def keep_busy() -> None:
        while not stop_busy.wait(1.0):
            chat(busy)

    user = threading.Thread(target=keep_busy, daemon=True)
    user.start()
    until = time.time() + 30
    while p.store.get_session(live_sid).state != states.RUNNING and time.time() < until:
        time.sleep(0.2)
    assert p.store.get_session(live_sid).state == states.RUNNING
    live_keys = retention.task_keys(r, keys, live)
    assert any(":gw:calls:" not in k and ":gw:session:" in k for k in live_keys), live_keys

    started = time.time()
    try:
        deadline = started + RETENTION + 25
        while time.time() < deadline and (keys_naming(r, done, done_sid) or
                                          keys_naming(r, orphan["session_id"], orphan["key"])):
            time.sleep(0.5)
        waited = time.time() - started
    finally:
        stop_busy.set()
        user.join(5)

    # The unexported finished task and the orphan: nothing of theirs is left, anywhere.
    assert keys_naming(r, done, done_sid, judge) == [], keys_naming(r, done, done_sid, judge)
    assert keys_naming(r, orphan["session_id"], orphan["key"]) == []
    assert r.zscore(keys.task_index(), done) is None and r.zscore(keys.groups_pending(), done) is None
    assert requests.get(f"{api}/v1/tasks/{done}", headers=AUTH, timeout=10).status_code == 404
    assert chat(orphan).status_code == 401  # its key no longer opens anything
    # Untouched: the live task (every key, no TTL), its gateway session, the session in use.
    assert p.store.get_session(live_sid).state not in states.TERMINAL
    assert set(live_keys) <= set(retention.task_keys(r, keys, live))
    # (a lease, and the gateway's in-flight hash, carry their own short TTLs; nothing else does)
    assert all(r.ttl(k) == -1 for k in live_keys if ":lease:" not in k and ":gw:inflight:" not in k), \
        {k: r.ttl(k) for k in live_keys}
    for s in (busy, of_live):
        assert r.exists(keys.gateway_session(s["session_id"])) and r.exists(keys.gateway_key(s["key"]))
    assert r.llen(keys.calls(busy["session_id"])) >= 2 and chat(busy).status_code == 200
    # The exported task expires on its own; the janitor did not count it.
    assert metric(api, "polar_mq_janitor_collected_tasks_total") == 1
    assert metric(api, "polar_mq_janitor_collected_sessions_total") >= 1
    assert metric(api, "polar_mq_janitor_collected_keys_total") >= len(owned) + 4
    print(f"collected {waited:.1f} s after the retention window opened (retention {RETENTION} s)")

    assert requests.delete(f"{api}/v1/tasks/{live}", headers=AUTH, timeout=10).status_code in (200, 202)
    p.wait([live_sid], timeout=60)
