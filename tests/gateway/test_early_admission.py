"""A call's admission script goes out before its body is read (core.Gateway.admit_early,
admission.Entry): against the suite's real Redis, the gateway in process (MockPool upstream)
with its RedisWire as in production.

What must hold: the call is in its session's in-flight hash while the body is still being read,
under the call id its record then gets; a call that fails before it starts (a malformed body, a
body its adapter refuses) leaves neither the session's in-flight hash nor this gateway's drain
count behind, and gives its Redis connection back; a cached key of a session collected since is
forgotten on that path too.
"""

from __future__ import annotations

import io
import threading
import time
from typing import Any

import pytest
import redis

from tests.support.mock_pool import MockPool, vllm_answer
from polar_mq.proxy_app.web.app import create_app
from polar_mq.proxy_app.web.fastpath import BODY_IN_MEMORY, FastPath
from polar_mq.store.wire import RedisWire
from polar_mq.settings import GatewaySettings
from polar_mq.store.core import GatewayStore

BODY = b'{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}'


@pytest.fixture()
def served(redis_url: str, tmp_path: Any):
    """(FastPath, its gateway, its store, a session) with a one-connection RedisWire: a connection
    an early admission did not give back would stop the next command."""
    client = redis.Redis.from_url(redis_url)
    store = GatewayStore(client, wire=RedisWire(client, max_connections=1))
    settings = GatewaySettings(upstreams=["mock://vllm"], redis_url=redis_url, served_model="mock-model",
                               spool_dir=str(tmp_path / "spool"), public_url="http://gw.test")
    answer = lambda body: vllm_answer(body, "hello there", prompt_ids=[1, 2, 3], completion_ids=[7, 8])
    app = create_app(settings, store=store, pool=MockPool(answer), startup_checks=False)
    fast = app.wsgi_app
    assert isinstance(fast, FastPath)
    gw = app.extensions["polar_gateway"]
    # One call of another session first: Redis then knows the admission script (EVALSHA).
    other = app.test_client().post("/sessions", json={"task_id": "warm-up"}).get_json()
    assert _call(fast, other["key"], io.BytesIO(BODY), len(BODY))[0] == "200 OK"
    session = app.test_client().post("/sessions", json={"task_id": "early-admission"}).get_json()
    yield fast, gw, store, session
    gw.pause.stop()


def _call(fast: FastPath, key: str, body_input: Any, length: int, path: str = "/v1/chat/completions",
          in_memory: bool = True) -> tuple[str, bytes]:
    """One call through FastPath; `in_memory`: the body is already read, as the lean worker
    hands it over (else it is still to come off the socket, as under gunicorn's own path)."""
    started: list[str] = []
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": f"/s/{key}{path}", "QUERY_STRING": "",
               "CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(length), "wsgi.input": body_input}
    if in_memory:
        environ[BODY_IN_MEMORY] = True
    result = fast(environ, lambda status, headers, exc_info=None: started.append(status))
    try:
        data = b"".join(result)
    finally:
        getattr(result, "close", lambda: None)()
    return started[0], data


def _drain_count(store: GatewayStore, gw: Any) -> int:
    return int(store.r.hget(store.keys.gateway_inflight_by_gateway(), gw.pause.gateway_id) or 0)


def _wire_is_free(store: GatewayStore) -> bool:
    """The wire's one connection is back: a command gets through (it would wait for a slot)."""
    done = threading.Event()
    threading.Thread(target=lambda: (store.wire.execute("PING"), done.set()), daemon=True).start()
    return done.wait(5)


class SlowBody:
    """A request body whose read waits until the call shows up in the session's in-flight hash
    (up to `wait` s), as a slow parse would; records what it saw."""

    def __init__(self, store: GatewayStore, session_id: str, data: bytes, wait: float = 3.0):
        self.store, self.session_id, self.data, self.wait = store, session_id, data, wait
        self.seen: dict[bytes, bytes] = {}

    def read(self, n: int = -1) -> bytes:
        probe = redis.Redis(connection_pool=self.store.r.connection_pool)
        deadline = time.monotonic() + self.wait
        while not self.seen and time.monotonic() < deadline:
            self.seen = probe.hgetall(self.store.keys.session_inflight(self.session_id))
            time.sleep(0.01)
        return self.data


@pytest.mark.parametrize("cached", [False, True], ids=["first-call", "cached-key"])
def test_the_call_is_in_flight_while_its_body_is_read(served, cached: bool) -> None:
    fast, gw, store, session = served
    if cached:
        assert _call(fast, session["key"], io.BytesIO(BODY), len(BODY))[0] == "200 OK"
        assert session["key"] in gw._keys
    body = SlowBody(store, session["session_id"], BODY)
    status, data = _call(fast, session["key"], body, len(BODY))
    assert status == "200 OK" and b"hello there" in data
    [call_id] = body.seen  # registered before the body was read, under the record's call id
    assert store.calls(session["session_id"])[-1].call_id == call_id.decode()
    assert store.inflight_calls(session["session_id"]) == 0
    assert _drain_count(store, gw) == 0


def test_a_body_still_on_the_socket_is_read_before_the_admission_goes_out(served) -> None:
    """Under gunicorn's own path the body comes off the client's socket as it is read: a slow
    upload must not hold a Redis connection, so the script goes out after the read (and still
    before the body is converted)."""
    fast, gw, store, session = served
    body = SlowBody(store, session["session_id"], BODY, wait=0.3)
    status, data = _call(fast, session["key"], body, len(BODY), in_memory=False)
    assert status == "200 OK" and b"hello there" in data
    assert body.seen == {}  # not registered while the body was being read
    [rec] = store.calls(session["session_id"])
    assert store.inflight_calls(session["session_id"]) == 0 and _drain_count(store, gw) == 0
    assert _wire_is_free(store)


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", b'{"model":"m","messages":['),  # not JSON
    ("/v1/chat/completions", b'[1, 2]'),  # JSON, not an object
    ("/v1/messages", b'{"model":"m","max_tokens":4,"messages":"hi"}'),  # refused by the adapter
], ids=["malformed", "not-an-object", "adapter-refuses"])
def test_a_call_that_fails_before_it_starts_withdraws_its_admission(served, path: str, body: bytes) -> None:
    fast, gw, store, session = served
    seen = SlowBody(store, session["session_id"], body)
    status, data = _call(fast, session["key"], seen, len(body), path)
    assert status.startswith("400"), (status, data)
    assert seen.seen  # it had been admitted
    assert store.inflight_calls(session["session_id"]) == 0
    assert _drain_count(store, gw) == 0
    assert store.calls(session["session_id"]) == []
    assert _wire_is_free(store)
    # and the next call goes through as usual
    assert _call(fast, session["key"], io.BytesIO(BODY), len(BODY))[0] == "200 OK"


def test_a_collected_sessions_cached_key_is_forgotten_on_a_malformed_body(served) -> None:
    fast, gw, store, session = served
    assert _call(fast, session["key"], io.BytesIO(BODY), len(BODY))[0] == "200 OK"
    store.r.delete(store.keys.gateway_key(session["key"]))  # retention collected the session
    bad = b'{"model":'
    status, _ = _call(fast, session["key"], io.BytesIO(bad), len(bad))
    assert status.startswith("400")  # the body's error is the one reported, as before
    assert session["key"] not in gw._keys
    assert store.inflight_calls(session["session_id"]) == 0
    assert _wire_is_free(store)
    status, data = _call(fast, session["key"], io.BytesIO(BODY), len(BODY))
    assert status.startswith("401"), (status, data)


def test_a_redis_that_forgot_the_script_still_admits(served) -> None:
    """SCRIPT FLUSH (or a restarted Redis): the early EVALSHA is refused, and the script is run
    by EVAL where its answer is read; the call goes through counted, and leaves as usual."""
    fast, gw, store, session = served
    during: list[tuple[int, int]] = []
    answer = gw.pool.answer

    def watched(body: dict[str, Any]) -> dict[str, Any]:
        during.append((store.inflight_calls(session["session_id"]), _drain_count(store, gw)))
        return answer(body)

    gw.pool.answer = watched
    store.r.script_flush()
    status, data = _call(fast, session["key"], io.BytesIO(BODY), len(BODY))
    assert status == "200 OK" and b"hello there" in data
    assert during == [(1, 1)]  # registered and counted while it generated
    [rec] = store.calls(session["session_id"])
    assert not any("not counted" in note for note in rec.notes)
    assert store.inflight_calls(session["session_id"]) == 0
    assert _drain_count(store, gw) == 0
    assert _wire_is_free(store)
