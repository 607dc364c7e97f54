"""A stream's reading passes from its reader thread to the client's writer (core.Handover).

After the first events the writer reads the upstream itself. What the queue between the two
would give must hold without it: keep-alive pings whenever the upstream is quiet mid-stream
(the upstream read waits at most a ping interval), the stall limit (POLAR_UPSTREAM_TIMEOUT)
over the quiet waits added up, and the record stored in every case. Real stand-in, real gateway
process (the gevent worker as shipped), real Redis.
"""

from __future__ import annotations

import queue
import socket
import time
from urllib.parse import urlsplit

import pytest
from tests.support.servers import GatewayHandle, start_gateway, start_model_server, stop

from polar_mq.proxy_app.core import Handover

TOKEN_MS = 300  # the stand-in's pause between tokens: several ping intervals
PING_S = 0.08


@pytest.fixture(scope="module")
def slow_upstream(log_dir) -> str:
    server = start_model_server(log_dir, "--token-latency-ms", str(TOKEN_MS), name="ms-handover")
    yield server.url
    stop(server.proc)


def _gateway(log_dir, redis_url, upstream: str, name: str, **env: str) -> GatewayHandle:
    server = start_gateway(log_dir, redis_url, [upstream], name=name,
                           env={"POLAR_PING_INTERVAL": str(PING_S), **env})
    return GatewayHandle(url=server.url, upstream_url=upstream, redis_url=redis_url, server=server)


def _raw_stream(gw: GatewayHandle, path: str, body: bytes, timeout: float = 30) -> list[tuple[float, bytes]]:
    """The reply's bytes as they arrived (time, piece): the client's view, pings included."""
    parts = urlsplit(gw.url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=timeout)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
    pieces = []
    while True:
        piece = sock.recv(65536)
        if not piece:
            break
        pieces.append((time.monotonic(), piece))
    sock.close()
    return pieces


def _wait_record(gw: GatewayHandle, sid: str, timeout: float = 20) -> dict:
    deadline = time.time() + timeout
    while True:
        calls = gw.calls(sid)
        if calls or time.time() > deadline:
            assert len(calls) == 1, calls
            return calls[0]
        time.sleep(0.05)


BODY = (b'{"model": "m", "stream": true, "max_tokens": 4, '
        b'"messages": [{"role": "user", "content": "polar:say=one two three four five"}]}')


def test_quiet_upstream_mid_stream_gets_pings_and_the_stream_completes(log_dir, redis_url, slow_upstream):
    gw = _gateway(log_dir, redis_url, slow_upstream, "gw-handover")
    try:
        s = gw.new_session()
        pieces = _raw_stream(gw, f"/s/{s['key']}/v1/chat/completions", BODY)
        data = b"".join(p for _, p in pieces)
        assert data.startswith(b"HTTP/1.1 200") and b"data: [DONE]" in data
        # Between the first and the last token frame the upstream was quiet ~TOKEN_MS at a time:
        # pings flowed there, not only before the headers.
        first = next(i for i, (_, p) in enumerate(pieces) if b'"content":"' in p and b'"content":""' not in p)
        later = b"".join(p for _, p in pieces[first + 1:])
        assert later.count(b": ping") >= 4, later
        rec = _wait_record(gw, s["session_id"])
        assert rec["status"] == "ok" and len(rec["completion_token_ids"]) == 4
        assert rec["completion_token_ids"] == gw.upstream_chat({"messages": rec["messages"], "max_tokens": 4})[
            "choices"][0]["token_ids"]
        assert rec["latency_ms"] >= 3 * TOKEN_MS
    finally:
        stop(gw.server.proc)


def test_a_stalled_upstream_fails_the_stream_after_the_read_timeout_and_keeps_the_record(log_dir, redis_url):
    upstream = start_model_server(log_dir, "--token-latency-ms", "4000", name="ms-stall")
    gw = _gateway(log_dir, redis_url, upstream.url, "gw-stall", POLAR_UPSTREAM_TIMEOUT="1")
    try:
        s = gw.new_session()
        t0 = time.monotonic()
        pieces = _raw_stream(gw, f"/s/{s['key']}/v1/chat/completions", BODY)
        took = time.monotonic() - t0
        data = b"".join(p for _, p in pieces)
        assert data.startswith(b"HTTP/1.1 200")  # the first events were out: the error is in the stream
        assert b'"error":' in data and b"stalled mid-stream" in data  # OpenAI's error event
        assert data.count(b": ping") >= 5  # pinged while it waited
        assert 1.0 <= took < 3.5, took  # the limit over the quiet waits in all, not per ping interval
        rec = _wait_record(gw, s["session_id"])
        assert rec["status"] == "error" and "stalled mid-stream" in rec["error"]
        assert rec["prompt_token_ids"]  # what the stream gave before it stalled is kept
    finally:
        stop(gw.server.proc)
        stop(upstream.proc)


class _Stream:
    def __init__(self, idle: bool = True):
        self.idle, self.every = idle, None

    def can_idle(self) -> bool:
        return self.idle

    def idle_every(self, seconds: float) -> None:
        self.every = seconds


def test_handover_after_the_writer_left_keeps_the_reader_reading():
    channel: queue.Queue = queue.Queue()
    steps = iter([("finish", None)])
    h = Handover(channel, 0.5)
    assert not h.give(steps, _Stream(idle=False))  # a stream that cannot idle is never handed over
    assert h.give(steps, handle := _Stream()) and handle.every == 0.5
    assert h.close() is steps  # given, never taken: the writer must finish it
    assert not h.give(steps, _Stream())  # the writer is gone: the reader reads on itself
    assert channel.empty()
