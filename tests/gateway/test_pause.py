"""Weight-sync pause through the real API and the real gateway sharing one Redis: in-flight
generations finish, new ones are held until resume."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest
import requests

from tests.support.servers import AUTH, spawn, start_gateway, stop
from polar_mq.cli.embedded_redis import free_port
from tests.api.test_api import start_api


@pytest.fixture(scope="module")
def api_on_gateway_redis(log_dir, redis_url):
    server = start_api(log_dir, redis_url, name="api-pause")
    yield server.url
    requests.post(f"{server.url}/v1/admin/resume", headers=AUTH, timeout=10)
    stop(server.proc)


def chat(session, content: str) -> requests.Response:
    return requests.post(f"{session['base_urls']['openai']}/chat/completions", timeout=60,
                         json={"model": "m", "messages": [{"role": "user", "content": content}]})


def test_pause_drains_in_flight_and_holds_new_generations(gateway, api_on_gateway_redis):
    api = api_on_gateway_redis
    s = gateway.new_session()
    results: dict[str, float] = {}

    def slow():
        chat(s, "slow polar:sleep=1.5").raise_for_status()
        results["slow_done"] = time.monotonic()

    t_slow = threading.Thread(target=slow)
    t_slow.start()
    time.sleep(0.5)  # the slow generation is in flight
    body = requests.post(f"{api}/v1/admin/pause", headers=AUTH, params={"wait": 10}, timeout=30).json()
    assert body["paused"] is True and body["drained"] is True and body["in_flight"] == 0
    assert "slow_done" in results  # pause returned only after the in-flight call finished

    def held():
        chat(s, "new work polar:notool").raise_for_status()
        results["held_done"] = time.monotonic()

    t_held = threading.Thread(target=held)
    t_held.start()
    time.sleep(1.5)
    assert "held_done" not in results  # held while paused
    resumed = time.monotonic()
    requests.post(f"{api}/v1/admin/resume", headers=AUTH, timeout=10).raise_for_status()
    t_held.join(30)
    t_slow.join(30)
    assert results["held_done"] >= resumed
    calls = gateway.calls(s["session_id"])
    assert [c["status"] for c in calls] == ["ok", "ok"]
    assert any("weight-sync pause" in n for n in calls[1]["notes"])


def test_no_generation_starts_after_pause_returns(gateway, api_on_gateway_redis):
    """The old gateway cached the flag for 0.2 s: a call right after pause slipped through."""
    api = api_on_gateway_redis
    s = gateway.new_session()
    requests.post(f"{api}/v1/admin/pause", headers=AUTH, params={"wait": 5}, timeout=30).raise_for_status()
    results: dict[str, float] = {}

    def right_after():
        chat(s, "polar:notool hello").raise_for_status()
        results["done"] = time.monotonic()

    threads = [threading.Thread(target=right_after) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.8)
    assert results == {} and gateway.calls(s["session_id"]) == []  # nothing went upstream
    status = requests.get(f"{api}/v1/admin/status", headers=AUTH, timeout=10).json()
    assert status["paused"] is True and status["in_flight"] == 0 and status["live_gateways"]
    resumed = time.time()
    requests.post(f"{api}/v1/admin/resume", headers=AUTH, timeout=10).raise_for_status()
    for t in threads:
        t.join(30)
    calls = gateway.calls(s["session_id"])
    assert len(calls) == 4 and all(c["started_at"] >= resumed - 0.05 for c in calls)
    assert all(c["held_ms"] >= 700 for c in calls)


def test_policy_version_stamped_across_a_pause_in_the_middle_of_a_session(gateway, api_on_gateway_redis):
    api = api_on_gateway_redis
    requests.post(f"{api}/v1/admin/resume", headers=AUTH, json={"policy_version": 1}, timeout=10).raise_for_status()
    s = gateway.new_session()
    chat(s, "turn one polar:notool").raise_for_status()
    paused = requests.post(f"{api}/v1/admin/pause", headers=AUTH, params={"wait": 5}, timeout=30).json()
    assert paused["drained"] and paused["policy_version"] == 1
    held = threading.Thread(target=lambda: chat(s, "turn two polar:notool").raise_for_status())
    held.start()  # the session's next call arrives during the weight sync
    time.sleep(0.5)
    # The stand-in offers vLLM's RL API: the pause reached it too.
    upstream = paused["upstreams"][gateway.upstream_url]
    assert upstream["rl_api"] is True and upstream["is_paused"] is True
    assert requests.get(f"{gateway.upstream_url}/is_paused", timeout=5).json() == {"is_paused": True}
    body = requests.post(f"{api}/v1/admin/resume", headers=AUTH, json={"policy_version": 2}, timeout=10).json()
    assert body["paused"] is False and body["policy_version"] == 2
    assert body["upstreams"][gateway.upstream_url] == {"rl_api": True, "weight_version": "2", "is_paused": False}
    assert requests.get(f"{gateway.upstream_url}/weight_info", timeout=5).json() == {"weight_version": "2"}
    held.join(30)
    chat(s, "turn three polar:notool").raise_for_status()
    calls = gateway.calls(s["session_id"])
    assert [c["policy_version"] for c in calls] == [1, 2, 2]
    assert calls[1]["held_ms"] > 0 and calls[0]["held_ms"] == 0
    status = requests.get(f"{api}/v1/admin/status", headers=AUTH, timeout=10).json()
    assert status["policy_version"] == 2 and status["paused"] is False
    assert status["upstreams"][gateway.upstream_url]["weight_version"] == "2"


def test_a_dead_gateway_does_not_block_the_drain(gateway, log_dir, redis_url, model_server):
    """kill -9 of a gateway mid-call: after its heartbeat TTL its call no longer counts."""
    port = free_port()  # an API with a short heartbeat TTL (the default is 10 s)
    api = spawn([sys.executable, "-m", "polar_mq.cli", "api", "--host", "127.0.0.1", "--port", str(port),
                 "--redis", redis_url, "--workers", "1"], f"http://127.0.0.1:{port}/health", log_dir,
                f"api-pause-ttl-{port}", env={"POLAR_API_TOKEN": "", "POLAR_GATEWAY_HEARTBEAT_TTL": "2"})
    doomed = start_gateway(log_dir, redis_url, [model_server], name="gateway-doomed")
    try:
        s = requests.post(f"{doomed.url}/sessions", headers=AUTH, json={}, timeout=10).json()
        def doomed_call():
            try:
                chat(s, "slow polar:sleep=30")
            except requests.RequestException:
                pass  # its gateway is killed under it

        threading.Thread(target=doomed_call, daemon=True).start()
        time.sleep(0.8)
        before = requests.get(f"{api.url}/v1/admin/status", headers=AUTH, timeout=10).json()
        assert before["in_flight"] == 1
        # Its id: the one gateway holding a call. Other gateways of this Redis (stopped by earlier
        # tests) may be stale too and are reported alongside it.
        doomed_ids = [gid for gid, n in before["in_flight_by_gateway"].items() if n == 1]
        assert len(doomed_ids) == 1
        os.killpg(doomed.proc.pid, signal.SIGKILL)
        t0 = time.monotonic()
        body = requests.post(f"{api.url}/v1/admin/pause", headers=AUTH, params={"wait": 20}, timeout=40).json()
        assert body["drained"] is True and body["in_flight"] == 0
        assert doomed_ids[0] in body["dead_gateways"] and time.monotonic() - t0 < 6
    finally:
        requests.post(f"{api.url}/v1/admin/resume", headers=AUTH, timeout=10)
        stop(api.proc)
        stop(doomed.proc)


def test_a_weight_sync_in_the_middle_of_a_pipeline_session(gateway, api_on_gateway_redis, tmp_path):
    """A real session (tiny agent: two model calls) whose second call arrives during a sync: its
    trace shows both versions call by call, and the held time is in the trajectory's stats."""
    from tests.support.pipeline import agent_task, make_pipeline

    api = api_on_gateway_redis
    p = make_pipeline(gateway, tmp_path)
    for stage in ("init", "run", "postrun"):
        p.start_worker(stage, 1)
    try:
        requests.post(f"{api}/v1/admin/resume", headers=AUTH, json={"policy_version": 7}, timeout=10).raise_for_status()
        _, sids = p.submit(agent_task(num_samples=1, instruction="Write hello into polar.txt polar:sleep=1.5",
                                      metadata={"policy_version": 7}))
        deadline = time.monotonic() + 60
        while requests.get(f"{api}/v1/admin/status", headers=AUTH, timeout=10).json()["in_flight"] < 1:
            assert time.monotonic() < deadline, "the session's first call never started"
            time.sleep(0.05)
        paused = requests.post(f"{api}/v1/admin/pause", headers=AUTH, params={"wait": 30}, timeout=60).json()
        assert paused["drained"] is True
        time.sleep(0.8)  # the trainer swaps weights; the agent's next call waits at the gateway
        requests.post(f"{api}/v1/admin/resume", headers=AUTH, json={"policy_version": 8}, timeout=10).raise_for_status()
        [rec] = p.wait(sids, timeout=90)
        assert rec.state == "COMPLETED"
        traj = p.store.get_trajectory(rec.session_id)
        [trace] = traj.traces  # prefix_merging: one trace for both calls
        assert trace.metadata["policy_version"] == 7 and traj.metadata["policy_version"] == 7
        assert trace.metadata["sampled_policy_versions"] == [7, 8]
        assert traj.metadata["sampled_policy_versions"] == [7, 8]
        assert traj.stats["held_seconds"] >= 0.5
    finally:
        requests.post(f"{api}/v1/admin/resume", headers=AUTH, timeout=10)
        p.stop()
