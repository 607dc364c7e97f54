"""The rollout API served as a real process (gunicorn via `polar-mq api`) on a real Redis."""

from __future__ import annotations

import base64
import json
import sys
import threading
import time

import msgpack
import pytest
import redis
import requests

from polar_mq import states
from polar_mq.cli.embedded_redis import free_port
from polar_mq.model import Trace, Trajectory
from polar_mq.store.pipeline import PipelineStore
from polar_mq.store.core import Keys, connect
from polar_mq.tasks.app.routing import INIT_TASK

from tests.support.servers import AUTH, spawn, stop

TOKEN = "s3cret-token"
http = requests.Session()  # the test run's token (conftest.AUTH) on every call to the API
http.headers.update(AUTH)


def db_url(redis_url: str, db: int) -> str:
    return redis_url.rsplit("/", 1)[0] + f"/{db}"


def start_api(log_dir, redis_url: str, *extra: str, name: str = "api", ready: str = "/health"):
    port = free_port()
    args = [sys.executable, "-m", "polar_mq.cli", "api", "--host", "127.0.0.1", "--port", str(port),
            "--redis", redis_url, "--workers", "1", *extra]
    server = spawn(args, f"http://127.0.0.1:{port}{ready}", log_dir, f"{name}-{port}")
    server.url = f"http://127.0.0.1:{port}"
    return server


@pytest.fixture(scope="module")
def api_redis(redis_url) -> str:
    url = db_url(redis_url, 11)
    redis.Redis.from_url(url).flushdb()
    return url


@pytest.fixture(scope="module")
def api(log_dir, api_redis):
    server = start_api(log_dir, api_redis)
    yield server.url
    stop(server.proc)


@pytest.fixture(scope="module")
def r(api_redis) -> redis.Redis:
    return connect(api_redis)


@pytest.fixture(scope="module")
def store(r) -> PipelineStore:
    return PipelineStore(r)


def shell_task(**over):
    task = {"instruction": "say hi", "num_samples": 2,
            "agent": {"harness": "shell", "options": {"command": "echo hi"}}}
    task.update(over)
    return task


def problem(resp, status: int) -> dict:
    assert resp.status_code == status, resp.text
    assert resp.headers["Content-Type"].startswith("application/problem+json")
    body = resp.json()
    assert body["status"] == status and body["title"] and body["detail"] and body["type"]
    return body


# --- validation ---------------------------------------------------------------------------------
@pytest.mark.parametrize("body,field", [
    ({"agent": {"harness": "shell", "options": {"command": "x"}}}, "instruction"),
    ({"instruction": "x", "agent": {"harness": "nope"}}, "agent.harness"),
    ({"instruction": "x", "agent": {"harness": "shell"}}, "agent.options.command"),
    ({"instruction": "x", "agent": {"harness": "codex"}, "num_samples": 0}, "num_samples"),
    ({"instruction": "x", "agent": {"harness": "codex"}, "runtime": {"backend": "docker"}}, "runtime.image"),
    ({"instruction": "x", "agent": {"harness": "codex"}, "runtime": {"prepare": [{"exec": "a"}, 3]}},
     "runtime.prepare[1]"),
    ({"instruction": "x", "agent": {"harness": "codex"}, "bogus": 1}, "bogus"),
    ([1, 2], "body"),
])
def test_validation_400_names_the_field(api, body, field):
    got = problem(http.post(f"{api}/v1/tasks", json=body, timeout=10), 400)
    assert got["field"] == field
    assert field in got["detail"]


def test_invalid_json_and_yaml_bodies(api):
    got = problem(http.post(f"{api}/v1/tasks", data="{not json",
                                headers={"Content-Type": "application/json"}, timeout=10), 400)
    assert got["field"] == "body" and "JSON" in got["detail"]
    got = problem(http.post(f"{api}/v1/tasks", data="a: [1, 2",
                                headers={"Content-Type": "application/yaml"}, timeout=10), 400)
    assert got["field"] == "body" and "YAML" in got["detail"]
    problem(http.post(f"{api}/v1/tasks", data="", timeout=10), 400)


def test_unknown_route_and_method_are_problems(api):
    problem(http.get(f"{api}/v2/nothing", timeout=10), 404)
    problem(http.put(f"{api}/v1/tasks", timeout=10), 405)
    assert problem(http.get(f"{api}/v1/tasks/nope", timeout=10), 404)["detail"].startswith("task")
    problem(http.get(f"{api}/v1/sessions/nope", timeout=10), 404)


# --- submit, idempotency, init messages ---------------------------------------------------------
def init_messages(r: redis.Redis) -> list[dict]:
    out = []
    for raw in r.lrange("init", 0, -1):
        envelope = json.loads(raw)
        body = msgpack.unpackb(base64.b64decode(envelope["body"]), raw=False)
        out.append({"task": envelope["headers"]["task"], "args": body[0],
                    "queue": envelope["properties"]["delivery_info"]["routing_key"]})
    return out


def test_submit_enqueues_one_init_per_session_and_is_idempotent(api, r, store):
    r.delete("init")
    body = shell_task(task_id="idem-1", num_samples=3, metadata={"k": "v"})
    resp = http.post(f"{api}/v1/tasks", json=body, timeout=10)
    assert resp.status_code == 202, resp.text
    data = resp.json()
    assert list(data) == ["task_id", "session_ids"]
    assert data["task_id"] == "idem-1" and len(data["session_ids"]) == 3
    assert r.llen("init") == 3
    msgs = init_messages(r)
    assert {m["task"] for m in msgs} == {INIT_TASK}
    assert {m["queue"] for m in msgs} == {"init"}
    assert sorted(m["args"][0] for m in msgs) == sorted(data["session_ids"])
    assert [rec.state for rec in store.get_sessions(data["session_ids"])] == [states.REGISTERED] * 3

    again = http.post(f"{api}/v1/tasks", json=body, timeout=10)
    assert again.status_code == 200 and again.json() == data
    assert r.llen("init") == 3  # no duplicate messages for an identical resubmit

    changed = problem(http.post(f"{api}/v1/tasks", json={**body, "instruction": "other"}, timeout=10), 409)
    assert "idem-1" in changed["detail"]
    assert r.llen("init") == 3


def test_yaml_submit_generates_task_id(api, r):
    text = "instruction: hello\nnum_samples: 1\nagent:\n  harness: shell\n  options:\n    command: echo hi\n"
    resp = http.post(f"{api}/v1/tasks", data=text, headers={"Content-Type": "application/yaml"}, timeout=10)
    assert resp.status_code == 202, resp.text
    assert len(resp.json()["task_id"]) >= 16 and len(resp.json()["session_ids"]) == 1


def test_resubmit_requeues_when_enqueue_never_finished(api, r, store):
    """A task stored but never enqueued (API crashed, broker down) is enqueued by the resubmit."""
    from polar_mq.taskspec import parse_task

    body = shell_task(task_id="half-done", num_samples=2)
    sids, created = store.create_task(parse_task(body))
    assert created
    r.delete("init")
    resp = http.post(f"{api}/v1/tasks", json=body, timeout=10)
    assert resp.status_code == 200 and resp.json()["session_ids"] == sids
    assert sorted(m["args"][0] for m in init_messages(r)) == sorted(sids)
    http.post(f"{api}/v1/tasks", json=body, timeout=10)
    assert r.llen("init") == 2


# --- status, sessions, results, cancel ----------------------------------------------------------
def walk(store: PipelineStore, sid: str, final: str = states.COMPLETED, reward: float | None = None) -> None:
    for st in (states.INITIALIZING, states.READY, states.RUNNING, states.POST_RUN, states.BUILDING,
               states.EVALUATING):
        assert store.transition(sid, st, node="test:1") is not None
    assert store.transition(sid, final, node="test:1", reward=reward, outcome=final) is not None


def trajectory(sid: str, task_id: str, status: str, reward: float | None) -> Trajectory:
    trace = Trace(prompt_ids=[1, 2, 3], response_ids=[4, 5], loss_mask=[1, 1], response_logprobs=[-0.1, -0.2],
                  messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
                  reward=reward, metadata={"role": "main"})
    return Trajectory(session_id=sid, task_id=task_id, status=status, builder="prefix_merging", traces=[trace],
                      stats={"calls": 1, "traces": 1, "delivered_fraction": 1.0}, reward=reward,
                      metadata={"harness": "shell"})


def test_status_follows_sessions_and_results_filter(api, store):
    data = http.post(f"{api}/v1/tasks", json=shell_task(task_id="stat-1", num_samples=4), timeout=10).json()
    sids = data["session_ids"]
    st = http.get(f"{api}/v1/tasks/stat-1", timeout=10).json()
    assert st["state"] == "pending" and st["counts"] == {"REGISTERED": 4} and st["terminal"] == 0
    assert [s["session_id"] for s in st["sessions"]] == sids
    assert set(st["sessions"][0]) >= {"state", "timings", "attempt", "node", "error", "reward", "durations"}

    store.transition(sids[0], states.INITIALIZING, node="host:42")
    st = http.get(f"{api}/v1/tasks/stat-1", timeout=10).json()
    assert st["state"] == "running" and st["counts"] == {"REGISTERED": 3, "INITIALIZING": 1}
    s0 = st["sessions"][0]
    assert s0["node"] == "host:42" and "initializing_start" in s0["timings"] and "initializing" in s0["durations"]

    rewards = {sids[0]: 1.0, sids[1]: 0.2, sids[2]: None}
    walk(store, sids[0], states.COMPLETED, 1.0)
    walk(store, sids[1], states.COMPLETED, 0.2)
    walk(store, sids[2], states.TIMEOUT, None)
    for sid, status in ((sids[0], "COMPLETED"), (sids[1], "COMPLETED"), (sids[2], "TIMEOUT")):
        store.save_trajectory(trajectory(sid, "stat-1", status, rewards[sid]))

    res = http.get(f"{api}/v1/tasks/stat-1/results", timeout=10).json()
    assert res["state"] == "running" and res["count"] == 3 and res["total_sessions"] == 4
    assert res["sessions_without_trajectory"] == [{"session_id": sids[3], "state": "REGISTERED", "error": None}]
    assert {t["session_id"] for t in res["trajectories"]} == set(sids[:3])
    assert res["trajectories"][0]["traces"][0]["prompt_ids"] == [1, 2, 3]

    res = http.get(f"{api}/v1/tasks/stat-1/results", params={"status": "completed"}, timeout=10).json()
    assert {t["session_id"] for t in res["trajectories"]} == set(sids[:2])
    assert res["sessions_without_trajectory"] == []
    res = http.get(f"{api}/v1/tasks/stat-1/results", params={"min_reward": 0.5}, timeout=10).json()
    assert [t["session_id"] for t in res["trajectories"]] == [sids[0]]
    res = http.get(f"{api}/v1/tasks/stat-1/results", params={"status": "TIMEOUT,ERROR"}, timeout=10).json()
    assert [t["session_id"] for t in res["trajectories"]] == [sids[2]]
    bad = problem(http.get(f"{api}/v1/tasks/stat-1/results", params={"min_reward": "x"}, timeout=10), 400)
    assert bad["field"] == "min_reward"

    walk(store, sids[3], states.ERROR)
    st = http.get(f"{api}/v1/tasks/stat-1", timeout=10).json()
    assert st["state"] == "done" and st["terminal"] == 4
    assert st["counts"] == {"COMPLETED": 2, "ERROR": 1, "TIMEOUT": 1}
    assert st["mean_reward"] == pytest.approx(0.6)

    sess = http.get(f"{api}/v1/sessions/{sids[0]}", timeout=10).json()
    assert sess["session_id"] == sids[0] and sess["state"] == "COMPLETED" and sess["reward"] == 1.0
    assert [h[0] for h in sess["history"]][:2] == ["REGISTERED", "INITIALIZING"]

    listed = http.get(f"{api}/v1/tasks", params={"limit": 100}, timeout=10).json()["tasks"]
    assert "stat-1" in [t["task_id"] for t in listed]
    assert "sessions" not in listed[0]


def test_cancel_errors_registered_sessions_and_flags_running_ones(api, store):
    sids = http.post(f"{api}/v1/tasks", json=shell_task(task_id="cancel-1", num_samples=3),
                         timeout=10).json()["session_ids"]
    for st in (states.INITIALIZING, states.READY, states.RUNNING):
        store.transition(sids[0], st)
    resp = http.delete(f"{api}/v1/tasks/cancel-1", timeout=10)
    assert resp.status_code == 202, resp.text
    body = resp.json()
    assert body["cancelled"] is True
    got = {s["session_id"]: (s["state"], s["error"]) for s in body["sessions"]}
    assert got[sids[0]] == ("RUNNING", None)
    assert got[sids[1]] == got[sids[2]] == ("ERROR", "cancelled")
    assert store.is_cancelled("cancel-1")
    st = http.get(f"{api}/v1/tasks/cancel-1", timeout=10).json()
    assert st["cancelled"] is True and st["state"] == "running"
    problem(http.delete(f"{api}/v1/tasks/no-such-task", timeout=10), 404)


# --- admin pause / resume -----------------------------------------------------------------------
def test_pause_waits_for_in_flight_then_resume(api, r):
    from polar_mq.store.pause import PauseState

    keys = Keys()
    gate = PauseState(r, keys)  # what a live gateway process does: heartbeat, admit, finish
    gate.heartbeat("gw-test", {"upstreams": []})
    assert gate.begin("gw-test")[0] and gate.begin("gw-test")[0]
    t0 = time.monotonic()
    body = http.post(f"{api}/v1/admin/pause", params={"wait": 0.3}, timeout=10).json()
    assert (body["paused"], body["in_flight"], body["drained"]) == (True, 2, False)
    assert body["in_flight_by_gateway"] == {"gw-test": 2}
    assert 0.25 <= time.monotonic() - t0 < 3
    assert r.exists(keys.gateway_paused())
    assert gate.begin("gw-test") == (False, None)  # paused: nothing new is admitted
    assert http.get(f"{api}/v1/admin/pause", timeout=10).json()["paused"] is True

    def drain() -> None:
        time.sleep(0.4)
        gate.end("gw-test")
        time.sleep(0.2)
        gate.end("gw-test")

    threading.Thread(target=drain, daemon=True).start()
    t0 = time.monotonic()
    body = http.post(f"{api}/v1/admin/pause", params={"wait": 20}, timeout=30).json()
    took = time.monotonic() - t0
    assert (body["paused"], body["in_flight"], body["drained"]) == (True, 0, True)
    assert 0.5 <= took < 5

    body = http.post(f"{api}/v1/admin/resume", timeout=10).json()
    assert body["paused"] is False
    assert not r.exists(keys.gateway_paused())
    problem(http.post(f"{api}/v1/admin/pause", params={"wait": "-1"}, timeout=10), 400)
    problem(http.post(f"{api}/v1/admin/pause", params={"mode": "later"}, timeout=10), 400)
    problem(http.post(f"{api}/v1/admin/resume", json={"policy_version": "v2"}, timeout=10), 400)
    http.post(f"{api}/v1/admin/resume", timeout=10)
    gate.forget("gw-test")


# --- health, metrics, openapi -------------------------------------------------------------------
def test_health_metrics_openapi(api, r, store):
    r.delete("init")
    http.post(f"{api}/v1/tasks", json=shell_task(task_id="metrics-1", num_samples=2), timeout=10)
    store.r.lpush(store.keys.ready(), "fake-ready")
    store.r.sadd(store.keys.ready_slots(), "fake-ready")
    try:
        health = http.get(f"{api}/health", timeout=10).json()
        assert health["status"] == "ok" and health["redis"] is True
        assert health["queues"]["init"] == 2 and set(health["queues"]) == {"init", "run", "postrun"}

        resp = http.get(f"{api}/metrics", timeout=10)
        assert resp.status_code == 200 and resp.headers["Content-Type"].startswith("text/plain")
        text = resp.text
        samples = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                samples[name] = float(value)
        assert samples['polar_mq_queue_length{queue="init"}'] == 2
        assert samples['polar_mq_queue_length{queue="run"}'] == 0
        assert samples["polar_mq_tasks_submitted_total"] >= 1
        assert samples["polar_mq_sessions_submitted_total"] >= 2
        assert samples['polar_mq_sessions_active{state="REGISTERED"}'] >= 2
        assert samples["polar_mq_ready_buffer_length"] == 1
        assert samples["polar_mq_ready_slots_held"] == 1
        assert "polar_mq_gateway_paused" in samples and "polar_mq_ready_capacity" in samples
        assert "# TYPE polar_mq_queue_length gauge" in text
    finally:
        store.take_ready("fake-ready")

    doc = http.get(f"{api}/openapi.json", timeout=10).json()
    assert doc["openapi"].startswith("3.1")
    for path in ("/v1/tasks", "/v1/tasks/{task_id}", "/v1/tasks/{task_id}/results", "/v1/sessions/{session_id}",
                 "/v1/admin/pause", "/v1/admin/resume", "/v1/admin/status", "/v1/groups/next",
                 "/v1/groups/{task_id}/ack", "/v1/groups/stats", "/health", "/metrics", "/openapi.json"):
        assert path in doc["paths"], path
    group = doc["components"]["schemas"]["Group"]
    assert set(group["required"]) == {"task_id", "metadata", "policy_version", "delivery", "sessions", "trajectories"}
    schema = doc["components"]["schemas"]["TaskRequest"]
    assert schema["required"] == ["instruction", "agent"]
    assert "shell" in schema["properties"]["agent"]["properties"]["harness"]["enum"]
    post = doc["paths"]["/v1/tasks"]["post"]
    assert {"202", "200", "400", "409"} <= set(post["responses"])


# --- auth and outages ---------------------------------------------------------------------------
def test_bearer_token_required_when_configured(log_dir, api_redis):
    server = start_api(log_dir, api_redis, "--token", TOKEN, name="api-token")
    try:
        url = server.url
        assert requests.get(f"{url}/health", timeout=10).status_code == 200  # public
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
            got = problem(requests.get(f"{url}/v1/tasks", headers=headers, timeout=10), 401)
            assert got["type"].endswith("unauthorized")
        resp = requests.post(f"{url}/v1/tasks", json=shell_task(), timeout=10)
        problem(resp, 401)
        assert resp.headers["WWW-Authenticate"].startswith("Bearer")
        problem(requests.get(f"{url}/metrics", timeout=10), 401)
        ok = {"Authorization": f"Bearer {TOKEN}"}
        assert requests.get(f"{url}/v1/tasks", headers=ok, timeout=10).status_code == 200
        assert requests.get(f"{url}/metrics", headers=ok, timeout=10).status_code == 200
        assert requests.post(f"{url}/v1/tasks", json=shell_task(), headers=ok, timeout=10).status_code == 202
    finally:
        stop(server.proc)


def test_redis_down_answers_503_problem(log_dir):
    dead = f"redis://127.0.0.1:{free_port()}/0"
    server = start_api(log_dir, dead, "--dev", name="api-dead", ready="/openapi.json")
    try:
        got = problem(http.get(f"{server.url}/health", timeout=15), 503)
        assert got["redis"] is False
        problem(http.post(f"{server.url}/v1/tasks", json=shell_task(), timeout=15), 503)
        problem(http.get(f"{server.url}/v1/tasks/x", timeout=15), 503)
    finally:
        stop(server.proc)
