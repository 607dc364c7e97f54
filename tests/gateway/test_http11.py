"""The gateway's lean HTTP/1.1 client (proxy_app/http11.py) against a raw socket server that
answers exactly the bytes each test gives it: framing, keep-alive reuse, stale connections,
aborts and timeouts."""

from __future__ import annotations

import socket
import threading
import time
from typing import Callable

import pytest

from polar_mq.proxy_app.upstream import http11


class RawServer:
    """Accepts connections; `handler(conn, request_bytes, n)` answers the n-th request."""

    def __init__(self, handler: Callable[[socket.socket, bytes, int], None]):
        self.handler = handler
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.root = f"http://127.0.0.1:{self.port}"
        self.requests: list[bytes] = []
        self.connections = 0
        self.closed_by_client = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        while True:
            while b"\r\n\r\n" not in buf:
                data = conn.recv(65536)
                if not data:
                    self.closed_by_client.set()
                    conn.close()
                    return
                buf += data
            head, _, rest = buf.partition(b"\r\n\r\n")
            length = int(next((line.split(b":")[1] for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length")), b"0"))
            while len(rest) < length:
                rest += conn.recv(65536)
            self.requests.append(head + b"\r\n\r\n" + rest[:length])
            buf = rest[length:]
            try:
                if self.handler(conn, self.requests[-1], len(self.requests)) == "close":
                    conn.close()
                    return
            except OSError:
                self.closed_by_client.set()
                return

    def stop(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() blocked in its thread
        except OSError:
            pass
        self.sock.close()


def json_answer(body: bytes, extra: str = "") -> bytes:
    return (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
            .encode() + body)


def test_content_length_answers_reuse_one_connection() -> None:
    server = RawServer(lambda conn, req, n: conn.sendall(json_answer(b'{"n": %d}' % n)))
    pool = http11.Http11Pool()
    for i in range(1, 4):
        resp = pool.request("POST", server.root, "/v1/chat/completions", b'{"x": 1}',
                            {"Content-Type": "application/json"})
        assert resp.status_code == 200 and resp.json() == {"n": i}
    assert server.connections == 1
    assert server.requests[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert b"Content-Length: 8\r\n" in server.requests[0] and server.requests[0].endswith(b'{"x": 1}')
    server.stop()


def test_chunked_stream_split_anywhere_decodes_in_order() -> None:
    payload = b"".join(b"data: {\"i\": %d}\n\n" % i for i in range(50)) + b"data: [DONE]\n\n"
    pieces = [payload[i:i + 37] for i in range(0, len(payload), 37)]
    wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"".join(
        b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\nX-Trailer: 1\r\n\r\n"

    def answer(conn: socket.socket, req: bytes, n: int) -> None:
        for i in range(0, len(wire), 5):  # byte dribbles: every state boundary gets split
            conn.sendall(wire[i:i + 5])
            if i % 200 == 0:
                time.sleep(0.001)

    server = RawServer(answer)
    pool = http11.Http11Pool()
    for _ in range(2):
        resp = pool.request("POST", server.root, "/s", b"{}")
        got = b""
        while True:
            piece = resp.read1()
            if not piece:
                break
            got += piece
        assert got == payload
    assert server.connections == 1  # the ended chunked answer left its connection reusable
    server.stop()


def test_connection_close_and_read_to_end_answers() -> None:
    def answer(conn: socket.socket, req: bytes, n: int) -> str:
        conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it")
        return "close"

    server = RawServer(answer)
    pool = http11.Http11Pool()
    assert pool.request("GET", server.root, "/").content == b"all of it"
    assert pool.request("GET", server.root, "/").content == b"all of it"
    assert server.connections == 2
    server.stop()


def test_stale_kept_alive_connection_is_replaced() -> None:
    def answer(conn: socket.socket, req: bytes, n: int) -> str | None:
        conn.sendall(json_answer(b"{}"))
        return "close" if n == 1 else None  # closes after answering, without saying so

    server = RawServer(answer)
    pool = http11.Http11Pool()
    assert pool.request("POST", server.root, "/", b"{}").status_code == 200
    time.sleep(0.1)
    assert pool.request("POST", server.root, "/", b"{}").status_code == 200
    assert server.connections == 2
    server.stop()


def test_close_aborts_a_reader_blocked_on_the_stream() -> None:
    def answer(conn: socket.socket, req: bytes, n: int) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        conn.recv(10)  # waits for the client to go away

    server = RawServer(answer)
    resp = http11.Http11Pool().request("POST", server.root, "/", b"{}")
    assert resp.read1() == b"hello"
    failed: list[BaseException] = []

    def reader() -> None:
        try:
            resp.read1()
        except http11.HttpError as exc:
            failed.append(exc)

    t = threading.Thread(target=reader)
    t.start()
    time.sleep(0.2)
    resp.close()
    t.join(5)
    assert not t.is_alive() and failed
    assert server.closed_by_client.wait(5)  # the upstream saw the connection close
    server.stop()


def test_read_timeout_and_refused_connection() -> None:
    server = RawServer(lambda conn, req, n: time.sleep(2))
    with pytest.raises(http11.ReadTimeout):
        http11.Http11Pool(timeout=0.3).request("POST", server.root, "/", b"{}")
    server.stop()
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()  # nothing listens there
    with pytest.raises(http11.ConnectError):
        http11.Http11Pool().request("POST", f"http://127.0.0.1:{port}", "/", b"{}")


def test_garbage_answer_is_a_protocol_error() -> None:
    server = RawServer(lambda conn, req, n: conn.sendall(b"SSH-2.0-OpenSSH\r\n\r\n"))
    with pytest.raises(http11.ProtocolError):
        http11.Http11Pool().request("POST", server.root, "/", b"{}")
    server.stop()


def _sse_answer(terminator_delay: float | None) -> Callable[[socket.socket, bytes, int], None]:
    """A chunked SSE answer ending in [DONE]; the chunked terminator after `terminator_delay` s
    (None: never, the connection stays open)."""
    def answer(conn: socket.socket, req: bytes, n: int) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for payload in (b'data: {"n": %d}\n\n' % n, b"data: [DONE]\n\n"):
            conn.sendall(b"%x\r\n%s\r\n" % (len(payload), payload))
        if terminator_delay is not None:
            time.sleep(terminator_delay)
            conn.sendall(b"0\r\n\r\n")
    return answer


def _read_to_done(pool: http11.Http11Pool, root: str) -> list:
    from polar_mq.proxy_app.upstream.pool import UpstreamStream

    stream = UpstreamStream(pool.request("POST", root, "/v1/chat/completions", b"{}"), root)
    stream.start()
    chunks = list(stream.chunks())
    assert stream.done  # stopped at [DONE], before the chunked terminator
    stream.release()
    return chunks


def test_a_stream_read_to_done_leaves_its_connection_reusable() -> None:
    server = RawServer(_sse_answer(0.005))  # the terminator a moment after [DONE]
    pool = http11.Http11Pool()
    assert [_read_to_done(pool, server.root) for _ in range(3)] == [[{"n": 1}], [{"n": 2}], [{"n": 3}]]
    assert server.connections == 1  # each call's connection served the next one
    server.stop()


def test_a_stream_without_its_terminator_is_closed_not_pooled() -> None:
    server = RawServer(_sse_answer(None))
    pool = http11.Http11Pool(timeout=30)
    t0 = time.monotonic()
    assert _read_to_done(pool, server.root) == [{"n": 1}]
    assert time.monotonic() - t0 < 5  # bounded by the release wait, not the read timeout
    assert server.closed_by_client.wait(5)
    assert _read_to_done(pool, server.root) == [{"n": 2}]
    assert server.connections == 2
    server.stop()
