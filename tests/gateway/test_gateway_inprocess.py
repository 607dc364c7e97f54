"""The gateway in process: `create_app(settings, store=..., pool=MockPool(answer))` and Flask's
test client, against the suite's real Redis, with no model server and no sockets.

For what does not need a model: the provider front ends, the recording of exact token ids, the
synthesised and passed-through streams, errors in each provider's shape (tests/support/mock_pool.py says
how the seam works). Fast: no process is started.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.mock_pool import MockPool, vllm_answer
from polar_mq.proxy_app.adapters.base import GatewayError
from polar_mq.proxy_app.web.app import create_app, redis_client
from polar_mq.settings import GatewaySettings
from polar_mq.store.core import GatewayStore

PROMPT_IDS, COMPLETION_IDS = [101, 102, 103, 104], [7, 8, 9]


def answer_hello(body: dict[str, Any]) -> dict[str, Any]:
    return vllm_answer(body, "hello there", prompt_ids=PROMPT_IDS, completion_ids=COMPLETION_IDS)


@pytest.fixture()
def gateway_app(redis_url: str, tmp_path: Any):
    """(test client, the pool) for a gateway whose upstream answers with `pool.answer`."""
    pool = MockPool(answer_hello)
    settings = GatewaySettings(upstreams=["mock://vllm"], redis_url=redis_url, served_model="mock-model",
                               spool_dir=str(tmp_path / "spool"), public_url="http://gw.test")
    app = create_app(settings, store=GatewayStore(redis_client(redis_url)), pool=pool, startup_checks=False)
    client = app.test_client()
    session = client.post("/sessions", json={"task_id": "inproc"}).get_json()
    yield client, pool, session
    app.extensions["polar_gateway"].pause.stop()


def recorded(client: Any, session: dict[str, Any]) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = client.get(f"/sessions/{session['session_id']}/calls").get_json()["calls"]
    return calls


def test_a_chat_call_goes_upstream_for_token_ids_and_is_recorded_with_them(gateway_app: Any) -> None:
    client, pool, session = gateway_app
    resp = client.post(f"/s/{session['key']}/v1/chat/completions",
                       json={"model": "anything", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})
    assert resp.status_code == 200, resp.get_data(as_text=True)
    body = resp.get_json()
    assert body["choices"][0]["message"]["content"] == "hello there"
    assert body["usage"]["prompt_tokens"] == len(PROMPT_IDS)
    [sent] = pool.requests
    assert sent["model"] == "mock-model" and sent["return_token_ids"] and sent["logprobs"]
    assert sent["messages"] == [{"role": "user", "content": "hi"}]
    [rec] = recorded(client, session)
    assert rec["provider"] == "openai_chat" and rec["prompt_token_ids"] == PROMPT_IDS
    assert rec["completion_token_ids"] == COMPLETION_IDS and rec["completion_logprobs"] == [-0.5, -0.6, -0.7]


@pytest.mark.parametrize("streams", [False, True], ids=["synthesised", "passed-through"])
def test_an_anthropic_stream_has_the_same_record_either_way(gateway_app: Any, streams: bool) -> None:
    client, pool, session = gateway_app
    pool.streams = pool.upstreams[0].stream_token_ids = streams
    resp = client.post(f"/s/{session['key']}/v1/messages", headers={"x-api-key": session["key"]},
                       json={"model": "claude-x", "max_tokens": 8, "stream": True,
                             "messages": [{"role": "user", "content": "hi"}]})
    assert resp.status_code == 200 and resp.mimetype == "text/event-stream"
    events = [json.loads(line[6:]) for line in resp.get_data(as_text=True).splitlines() if line.startswith("data: ")]
    kinds = [e["type"] for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    text = "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
    assert text == "hello there"
    [sent] = pool.requests
    assert bool(sent.get("stream")) is streams  # passed through: the upstream was asked to stream
    [rec] = recorded(client, session)
    assert rec["stream"] and rec["provider"] == "anthropic"
    assert (rec["prompt_token_ids"], rec["completion_token_ids"]) == (PROMPT_IDS, COMPLETION_IDS)
    assert any("synthetic stream" in note for note in rec["notes"]) is not streams


def test_an_unreachable_upstream_is_each_providers_retryable_error_and_still_recorded(gateway_app: Any) -> None:
    client, pool, session = gateway_app

    def down(body: dict[str, Any]) -> dict[str, Any]:
        raise GatewayError("upstream_unavailable", "upstream mock://vllm unreachable: connection refused")

    pool.answer = down
    chat = client.post(f"/s/{session['key']}/v1/chat/completions",
                       json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 503 and chat.get_json()["error"]["code"] == "server_error"
    claude = client.post(f"/s/{session['key']}/v1/messages",
                         json={"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
    assert claude.status_code == 529 and claude.get_json()["error"]["type"] == "overloaded_error"
    assert "retry-after" in claude.headers
    records = recorded(client, session)
    assert len(records) == 2 and all("unreachable" in (r["error"] or "") for r in records)


def test_an_unknown_key_is_refused_in_the_provider_shape_and_nothing_goes_upstream(gateway_app: Any) -> None:
    client, pool, _ = gateway_app
    gemini = client.post("/s/pmq-nope/v1beta/models/m:generateContent",
                         json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]})
    assert gemini.status_code == 401 and gemini.get_json()["error"]["status"] == "UNAUTHENTICATED"
    chat = client.post("/v1/chat/completions", headers={"Authorization": "Bearer pmq-nope"},
                       json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 401 and chat.get_json()["error"]["type"] == "authentication_error"
    assert pool.requests == []


def test_a_cancel_aborts_this_process_calls_at_once_not_at_the_watchers_next_tick(gateway_app: Any) -> None:
    """Under load the watcher's Redis tick can come seconds late while a fast model fills the
    socket; the cancel request itself aborts the calls of its own process."""
    client, pool, session = gateway_app
    gw = client.application.extensions["polar_gateway"]
    gw.registry.interval = 3600.0  # the watcher would not see the flag within this test
    call = gw.registry.start(session["session_id"], "call-in-flight")
    closed: list[str] = []
    call.on_abort(lambda: closed.append("upstream closed"))
    other = gw.registry.start("another-session", "call-of-another-session")
    try:
        resp = client.post(f"/sessions/{session['session_id']}/cancel")
        assert resp.status_code == 200, resp.get_data(as_text=True)
        assert call.reason == "the session was cancelled" and closed == ["upstream closed"]
        assert other.reason is None
    finally:
        gw.registry.finish(call)
        gw.registry.finish(other)


def test_a_stream_closed_before_its_first_frame_still_ends_and_is_recorded(gateway_app: Any) -> None:
    """The lean worker closes the reply without asking for a frame when the client is gone
    before the headers go out (closing a generator that never started runs nothing). The call
    must still end (aborted: nobody wants the rest) and be recorded, whether the reader thread
    still holds the stream or has handed it to the writer. Called as the lean worker calls it."""
    import io
    import time

    from polar_mq.proxy_app.web.fastpath import BODY_IN_MEMORY

    client, pool, session = gateway_app
    pool.streams = pool.upstreams[0].stream_token_ids = True
    body = json.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}).encode()
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": f"/s/{session['key']}/v1/chat/completions",
               "QUERY_STRING": "", "CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(body)),
               "wsgi.input": io.BytesIO(body), BODY_IN_MEMORY: True}
    status: list[str] = []
    frames = client.application.wsgi_app(environ, lambda s, h, e=None: status.append(s))
    assert status == ["200 OK"]
    frames.close()  # not one frame asked for
    deadline = time.time() + 10
    while not recorded(client, session) and time.time() < deadline:
        time.sleep(0.05)
    [rec] = recorded(client, session)
    assert rec["status"] == "error" and "client closed" in rec["error"]
    assert rec["prompt_token_ids"] == PROMPT_IDS
