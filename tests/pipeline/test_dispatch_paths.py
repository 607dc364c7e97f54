"""The stages' short paths for dispatch speed (issue 16) keep their answers.

GatewayClient registers, waits for and reads a gateway session straight in Redis once it has
seen that the gateway uses the same Redis (tasks/context.py); these tests run it against the
suite's real gateway and redis-server and check the gateway then serves, records and reports
those sessions exactly as sessions made over its HTTP API — and that a gateway on another Redis
keeps the HTTP path.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import openai
import redis
import requests

from tests.support.servers import AUTH, TOKEN
from tests.support.pipeline import agent_task, make_pipeline
from polar_mq import states
from polar_mq.store.core import GatewayStore
from polar_mq.tasks.app.context import GatewayClient


def _chat(answer: dict[str, Any]) -> None:
    chat = openai.OpenAI(base_url=answer["base_urls"]["openai"], api_key=answer["key"], max_retries=0)
    chat.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)


def test_gateway_sessions_go_direct_once_redis_is_seen_shared(gateway: Any, redis_url: str) -> None:
    direct = GatewayStore(redis.Redis.from_url(redis_url))
    client = GatewayClient(gateway.url, TOKEN, direct=direct)
    assert client.shared_root() is None  # nothing seen yet: HTTP
    first = client.create_session(f"disp-{uuid.uuid4().hex[:8]}", "t", {"k": 1})
    assert first["created"] is True  # the gateway's own answer (HTTP)
    assert client.shared_root() == first["base_urls"]["anthropic"].rsplit("/s/", 1)[0]

    sid = f"disp-{uuid.uuid4().hex[:8]}"
    second = client.create_session(sid, "t", {"k": 2}, {"temperature": 0.5})
    assert "created" not in second  # made in Redis, not by the gateway
    served = requests.get(f"{gateway.url}/sessions/{sid}", headers=AUTH, timeout=10).json()
    assert served["key"] == second["key"] and served["base_urls"] == second["base_urls"]
    assert served["metadata"] == {"k": 2} and served["sampling"] == {"temperature": 0.5}
    _chat(second)  # the gateway admits the key and records the call
    assert client.wait_idle(sid, 1.0) == 0
    calls = client.calls(sid)
    assert len(calls) == 1 and calls[0].completion_token_ids
    assert [c.to_dict() for c in calls] == [c.to_dict() for c in GatewayClient(gateway.url, TOKEN).calls(sid)]
    again = client.create_session(sid, "t", {"k": 2})  # a re-registration gets the same key back
    assert again["key"] == second["key"]
    # Postrun's wait-then-read in one round trip per look: the same records; a call still in
    # flight is waited for (bounded) and reported.
    still, same = client.idle_calls(sid, 1.0)
    assert still == 0 and [c.to_dict() for c in same] == [c.to_dict() for c in calls]
    assert direct.call_started(sid, "call-in-flight")
    t0 = time.monotonic()
    still, same = client.idle_calls(sid, 0.5)
    assert still == 1 and time.monotonic() - t0 >= 0.5 and len(same) == 1
    assert client.wait_idle(sid, 0.0) == 1  # the two-step path agrees


def test_gateway_on_another_redis_stays_on_http(gateway: Any, redis_url: str) -> None:
    other = redis.Redis.from_url(redis_url.rsplit("/", 1)[0] + "/7")  # same server, another database
    client = GatewayClient(gateway.url, TOKEN, direct=GatewayStore(other))
    answer = client.create_session(f"disp-{uuid.uuid4().hex[:8]}", "t", {})
    assert answer["created"] is True and client.shared_root() is None
    answer = client.create_session(f"disp-{uuid.uuid4().hex[:8]}", "t", {})
    assert answer["created"] is True  # still the gateway's HTTP answer
    _chat(answer)
    assert client.wait_idle(answer["session_id"], 1.0) == 0 and client.shared_root() is None
    assert len(client.calls(answer["session_id"])) == 1
    assert other.dbsize() == 0  # nothing written where the gateway does not look


def test_pipeline_sharing_the_gateways_redis(gateway: Any, redis_server: Any, tmp_path: Path) -> None:
    """Real pools on the gateway's own Redis (so stages take the direct gateway path): the
    sessions' model calls are recorded and built into their trajectories, harnesses got the
    gateway's base URLs, and the pools log no per-task INFO lines (settings.task_log) while
    their startup lines are still there."""
    p = make_pipeline(gateway, tmp_path, redis_server=redis_server)
    p.redis_server = None  # the suite's server: not ours to stop
    try:
        for stage in ("init", "run", "postrun"):
            p.start_worker(stage, 1)
        _, sids = p.submit(agent_task(num_samples=3))
        recs = p.wait(sids, timeout=90)
        for rec in recs:
            assert rec.state == states.COMPLETED, (rec.state, rec.error)
            assert rec.base_urls["openai"] == f"{gateway.url}/s/{rec.gateway_key}/v1"
            traj = p.store.get_trajectory(rec.session_id)
            assert traj.stats["calls"] == 2 and traj.stats["traces"] == 1
            served = requests.get(f"{gateway.url}/sessions/{rec.gateway_session_id}/calls", headers=AUTH,
                                  timeout=10).json()["calls"]
            assert len(served) == 2
    finally:
        p.stop()
    logs = "".join(f.read_text(errors="replace") for f in tmp_path.glob("worker-*.log"))
    assert "ready." in logs  # Celery's own startup line: the worker logs at INFO
    assert "Received task" not in logs and "succeeded in" not in logs
