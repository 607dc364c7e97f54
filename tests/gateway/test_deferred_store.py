"""A plain call's reply is written before Redis's answer to its record's MULTI is read
(fastpath.ThenStore, core.Storing, capture.PendingRecord, store.RecordWrite, redis_wire.Sent):
against the suite's real Redis, with the gateway in process (MockPool upstream) and its
RedisWire as in production.

What must hold: the MULTI is sent before the reply exists, so the record is in Redis when the
client reads its answer; Redis's answer is read when the server closes the reply (until then the
connection is the call's); a Redis that does not answer in time gets the record spooled, and the
connection back; without a RedisWire (a redis-py pipeline) nothing is deferred.
"""

from __future__ import annotations

import io
import threading
import time
from typing import Any

import pytest
import redis

from tests.support.mock_pool import MockPool, vllm_answer
from polar_mq.model import CaptureRecord
from polar_mq.proxy_app.adapters.base import GatewayError
from polar_mq.proxy_app.web.app import create_app
from polar_mq.proxy_app.capture import Recorder
from polar_mq.proxy_app.web.fastpath import FastPath, ThenStore
from polar_mq.store.wire import RedisWire
from polar_mq.settings import GatewaySettings
from polar_mq.store.core import GatewayStore

BODY = b'{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}'


def _answer(body: dict[str, Any]) -> dict[str, Any]:
    return vllm_answer(body, "hello there", prompt_ids=[1, 2, 3], completion_ids=[7, 8])


@pytest.fixture()
def served(redis_url: str, tmp_path: Any):
    """(FastPath, its gateway, its store, a session, the spool dir) with a one-connection RedisWire."""
    client = redis.Redis.from_url(redis_url)
    store = GatewayStore(client, wire=RedisWire(client, max_connections=1))
    settings = GatewaySettings(upstreams=["mock://vllm"], redis_url=redis_url, served_model="mock-model",
                               spool_dir=str(tmp_path / "spool"), public_url="http://gw.test")
    app = create_app(settings, store=store, pool=MockPool(_answer), startup_checks=False)
    session = app.test_client().post("/sessions", json={"task_id": "deferred"}).get_json()
    fast = app.wsgi_app
    assert isinstance(fast, FastPath)
    gw = app.extensions["polar_gateway"]
    yield fast, gw, store, session, tmp_path / "spool"
    gw.pause.stop()


def _call(fast: FastPath, key: str) -> tuple[str, Any]:
    started: list[str] = []
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": f"/s/{key}/v1/chat/completions", "QUERY_STRING": "",
               "CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(BODY)),
               "wsgi.input": io.BytesIO(BODY)}
    result = fast(environ, lambda status, headers, exc_info=None: started.append(status))
    return started[0], result


def test_the_reply_comes_first_and_redis_is_answered_at_close(served) -> None:
    fast, gw, store, session, spool = served
    status, result = _call(fast, session["key"])
    assert status == "200 OK" and isinstance(result, ThenStore)
    assert b"hello there" in b"".join(result)
    # The MULTI went out before the reply: another connection already reads the record.
    [rec] = store.calls(session["session_id"])
    assert rec.completion_token_ids == [7, 8]
    # Until close() the wire's one connection waits for the MULTI's answer: another command waits.
    done = threading.Event()
    threading.Thread(target=lambda: (store.wire.execute("PING"), done.set()), daemon=True).start()
    assert not done.wait(0.3)
    result.close()
    assert done.wait(5)
    assert gw.store.inflight_calls(session["session_id"]) == 0
    assert not spool.exists()
    result.close()  # a second close does nothing
    # The next call on the connection sees its parent stored, as TITO needs.
    status, second = _call(fast, session["key"])
    second.close()
    assert status == "200 OK" and len(store.calls(session["session_id"])) == 2


def test_the_live_metrics_see_the_call_once_after_its_reply(served) -> None:
    fast, gw, store, session, spool = served
    seen: list[str] = []
    gw.recorder.observers.append(lambda record: seen.append(record.call_id))
    status, result = _call(fast, session["key"])
    assert status == "200 OK" and b"hello there" in b"".join(result)
    assert seen == []  # the reply is out; the observers wait for Redis's answer to the record
    result.close()
    [rec] = store.calls(session["session_id"])
    assert seen == [rec.call_id]
    result.close()
    assert seen == [rec.call_id]


def test_an_error_reply_is_deferred_too_and_a_bad_key_is_not(served) -> None:
    fast, gw, store, session, spool = served
    def refuse(body: dict[str, Any]) -> dict[str, Any]:
        raise GatewayError("upstream_error", "upstream said no")

    gw.pool.answer = refuse  # the upstream fails: the call is recorded as an error
    status, result = _call(fast, session["key"])
    assert status.startswith("502"), status
    assert isinstance(result, ThenStore)
    result.close()
    [rec] = store.calls(session["session_id"])
    assert rec.status == "error"
    status, result = _call(fast, "pmq-not-a-key")
    assert status.startswith("401") and not isinstance(result, ThenStore)


def test_a_redis_that_does_not_answer_in_time_gets_the_record_spooled(redis_url: str, tmp_path: Any) -> None:
    """The MULTI is sent while Redis holds writes (CLIENT PAUSE WRITE); its answer does not come
    within the socket timeout: the record goes to the spool, the caller gets the store error
    (logged by the gateway when its client already has its answer), and the connection's slot is
    free again."""
    admin = redis.Redis.from_url(redis_url)
    client = redis.Redis.from_url(redis_url, socket_timeout=0.3)
    wire = RedisWire(client, max_connections=1)
    store = GatewayStore(client, wire=wire)
    recorder = Recorder(store, str(tmp_path / "spool"))
    record = CaptureRecord(session_id="deferred-timeout", provider="openai_chat", completion_token_ids=[5])
    admin.delete(store.keys.calls("deferred-timeout"))
    wire.execute("PING")  # a connection exists before the pause
    admin.execute_command("CLIENT", "PAUSE", "1500", "WRITE")
    try:
        pending = recorder.send(record)
        assert pending.waiting
        t0 = time.monotonic()
        stored, error = pending.finish()
        assert time.monotonic() - t0 < 1.4  # the socket timeout, not the pause
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")
    assert not stored and error is not None and error.kind == "store_unavailable"
    assert (tmp_path / "spool" / "deferred-timeout.msgpack").stat().st_size > 0
    assert pending.finish() == (stored, error)  # once
    assert wire.execute("PING") in (True, b"PONG", "PONG")  # the slot came back


def test_without_a_redis_wire_nothing_is_deferred(redis_url: str, tmp_path: Any) -> None:
    recorder = Recorder(GatewayStore(redis.Redis.from_url(redis_url)), str(tmp_path / "spool"))
    pending = recorder.send(CaptureRecord(session_id="deferred-pipeline", provider="openai_chat"))
    assert not pending.waiting and pending.finish() == (True, None)
