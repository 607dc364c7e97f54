"""RedisWire (the gateway's per-call Redis commands without redis-py's pool layers) against a real
redis-server: same replies as the client, scripts loaded when Redis forgot them, transactions
whole, a restarted Redis never answered on a dead socket, and the store's record write through it
equal to the pipeline's."""

from __future__ import annotations

import threading

import pytest
import redis

from polar_mq.cli.embedded_redis import start_embedded
from polar_mq.model import CaptureRecord
from polar_mq.store.wire import RedisWire
from polar_mq.store.core import GatewayStore, Keys

SCRIPT = "redis.call('HINCRBY', KEYS[1], ARGV[1], 1) return {1, redis.call('HGET', KEYS[1], ARGV[1])}"


@pytest.fixture()
def client(redis_url):
    r = redis.Redis.from_url(redis_url)
    r.flushdb()
    return r


def test_commands_and_scripts_answer_as_the_client(client):
    wire = RedisWire(client)
    assert wire.execute("SET", "k", b"v") in (True, b"OK", "OK")
    assert wire.execute("GET", "k") == client.get("k") == b"v"
    client.script_flush()
    sha = client.script_load(SCRIPT)
    client.script_flush()  # Redis forgot it: EVALSHA answers NOSCRIPT, the wire loads it with EVAL
    assert wire.evalsha(sha, SCRIPT, ["h"], ["f"]) == [1, b"1"]
    assert wire.evalsha(sha, SCRIPT, ["h"], ["f"]) == [1, b"2"]  # now by digest
    with pytest.raises(redis.ResponseError):
        wire.execute("HGET", "k", "f")  # WRONGTYPE: raised as the client raises it
    assert wire.execute("GET", "k") == b"v"  # and the connection is still usable


def test_transaction_is_one_multi_and_reports_errors_in_place(client):
    wire = RedisWire(client)
    client.set("s", "x")
    replies = wire.transaction([("RPUSH", "l", b"a"), ("HSET", "s", "f", "v"), ("RPUSH", "l", b"b")])
    assert replies[0] == 1 and isinstance(replies[1], redis.ResponseError) and replies[2] == 2
    assert client.lrange("l", 0, -1) == [b"a", b"b"]  # the others ran (as MULTI does)
    with pytest.raises(redis.ResponseError):  # rejected while queueing: nothing runs (EXECABORT)
        wire.transaction([("RPUSH", "l", b"c"), ("NOSUCHCOMMAND",)])
    assert client.llen("l") == 2


def test_a_restarted_redis_is_reached_on_a_new_connection():
    server = start_embedded()
    try:
        wire = RedisWire(redis.Redis.from_url(server.url))
        wire.execute("SET", "a", "1")
        port = server.url.rsplit(":", 1)[1].split("/")[0]
        server.stop()
        server = start_embedded(int(port))
        # The pooled connection was to the old process: it is found closed before use and
        # replaced, not written to (the command would be lost on a dead socket).
        assert wire.execute("SET", "a", "2") in (True, b"OK", "OK")
        assert wire.execute("GET", "a") == b"2"
        server.stop()
        with pytest.raises(redis.ConnectionError):  # Redis gone: the client's error, as redis-py
            wire.execute("GET", "a")
    finally:
        server.stop()


def test_connections_are_bounded_and_reused(client):
    wire = RedisWire(client, max_connections=3)
    before = len(client.client_list())
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for i in range(50):
                wire.execute("INCR", "n")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and int(client.get("n")) == 400
    assert len(client.client_list()) - before <= 3


def test_the_store_writes_the_same_record_through_the_wire(client):
    rec = CaptureRecord(session_id="s1", call_id="c1", provider="openai_chat", started_at=1.0,
                        messages=[{"role": "user", "content": "hello " * 40}],
                        prompt_token_ids=list(range(600)), completion_token_ids=[1, 2, 3],
                        completion_logprobs=[-0.1, -0.2, -0.3])
    plain = GatewayStore(client)
    wired = GatewayStore(client, wire=RedisWire(client))
    plain.append_call(rec)
    wired.append_call(CaptureRecord.from_dict({**rec.to_dict(), "session_id": "s2"}),
                      also=lambda cmds: cmds.hdel("inflight:s2", "c1"))
    a, b = plain.calls("s1")[0].to_dict(), wired.calls("s2")[0].to_dict()
    assert {**a, "session_id": "s2"} == b
    assert client.hlen(plain.keys.call_chunks("s1")) == client.hlen(wired.keys.call_chunks("s2")) > 0



def test_commands_are_packed_as_redis_py_packs_them(client):
    """The one-buffer packing (pack_commands) gives redis-py's bytes: str, unicode, bytes, ints,
    floats, bytearray and memoryview arguments, a command name with a space; an argument neither
    takes is refused with redis-py's DataError."""
    from polar_mq.store.wire import pack_commands

    conn = client.connection_pool.get_connection()
    try:
        cases = [
            [("SET", "k", b"v\x00\xff")],
            [("MULTI",), ("HSETNX", "h", b"\x01" * 40, b"x" * 70000), ("RPUSH", "l", "é✓", 7, -3, 0.1, 1e300),
             ("EXEC",)],
            [("EVALSHA", "abc", 2, "k1", "k2", 1796275334.123456, bytearray(b"ba"), memoryview(b"mv"))],
            [("CONFIG GET", "maxmemory")],
        ]
        for commands in cases:
            assert pack_commands(conn, commands) == b"".join(conn.pack_commands(commands)), commands
        with pytest.raises(redis.DataError):
            pack_commands(conn, [("SET", "k", object())])
    finally:
        client.connection_pool.release(conn)


def test_the_watchers_and_heartbeats_commands_answer_as_through_the_client(client):
    """The call watcher's cancellation check (4 times a second) and the pause heartbeat go
    through the wire when the store has one: same answers, same keys written."""
    from polar_mq.store.pause import PauseState

    # A prefix of its own: gateways other tests left running heartbeat under the default one.
    keys = Keys("pmq-wire-test")
    piped, wired = GatewayStore(client, keys), GatewayStore(client, keys, wire=RedisWire(client))
    wired.cancel_session("s2")
    sessions = ["s1", "s2", "s3"]
    assert piped.cancelled_sessions(sessions) == wired.cancelled_sessions(sessions) == {"s2"}
    state = PauseState(client, wired.keys)
    state.wire = wired.wire
    state.heartbeat("gw-a", {"url": "http://a"})
    plain = PauseState(client, piped.keys)
    plain.heartbeat("gw-b", {"url": "http://b"})
    beats = dict(client.zrange(wired.keys.gateway_heartbeats(), 0, -1, withscores=True))
    assert set(beats) == {b"gw-a", b"gw-b"} and abs(beats[b"gw-a"] - beats[b"gw-b"]) < 5
    assert client.hgetall(wired.keys.gateway_info()) == {b"gw-a": b'{"url": "http://a"}',
                                                       b"gw-b": b'{"url": "http://b"}'}
