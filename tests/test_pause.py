"""Weight-sync pause through the real API and the real gateway sharing one Redis: in-flight
generations finish, new ones are held until resume."""

from __future__ import annotations

import threading
import time

import pytest
import requests

from conftest import stop
from test_api import start_api


@pytest.fixture(scope="module")
def api_on_gateway_redis(log_dir, redis_url):
    server = start_api(log_dir, redis_url, name="api-pause")
    yield server.url
    requests.post(f"{server.url}/v1/admin/resume", timeout=10)
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
    body = requests.post(f"{api}/v1/admin/pause", params={"wait": 10}, timeout=30).json()
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
    requests.post(f"{api}/v1/admin/resume", timeout=10).raise_for_status()
    t_held.join(30)
    t_slow.join(30)
    assert results["held_done"] >= resumed
    calls = gateway.calls(s["session_id"])
    assert [c["status"] for c in calls] == ["ok", "ok"]
    assert any("weight-sync pause" in n for n in calls[1]["notes"])
