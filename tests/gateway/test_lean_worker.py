"""lean_worker: the gateway's lean path takes only the plain provider call, builds the environ
gunicorn builds for it and writes the head gunicorn writes; every other request reaches gunicorn
with its bytes intact, on the same connection."""

from __future__ import annotations

import json
import socket
import time

import pytest
from gunicorn import util
from gunicorn.config import Config
from gunicorn.http import wsgi
from gunicorn.http.parser import RequestParser
from gunicorn_h1c import parse_request

from polar_mq.proxy_app.web import lean_worker

BODY = b'{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi polar:notool"}]}'
SDK_HEADERS = [("Host", "127.0.0.1:8600"), ("User-Agent", "OpenAI/Python 1.99.0"),
               ("Accept-Encoding", "gzip, deflate"), ("Accept", "application/json"),
               ("Connection", "keep-alive"), ("Content-Type", "application/json"),
               ("X-Stainless-Lang", "python"), ("X-Stainless-Retry-Count", "0"),
               ("Authorization", "Bearer pk_x"), ("anthropic-beta", "a,b"), ("Anthropic-Beta", "c")]


def raw(method: str = "POST", target: str = "/s/pk_abc/v1/chat/completions", headers=None,
        body: bytes = BODY, version: str = "1.1", length: bool = True) -> bytes:
    lines = [f"{method} {target} HTTP/{version}"]
    for k, v in SDK_HEADERS if headers is None else headers:
        lines.append(f"{k}: {v}")
    if length:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def decide(data: bytes, max_body: int = 1 << 20) -> lean_worker.Request | None:
    """As serve_lean decides: a head the C parser refuses is gunicorn's too (it answers the error)."""
    try:
        parsed = parse_request(data)
    except Exception:
        return None
    return lean_worker.lean_request(parsed, max_body)


def test_the_plain_sdk_call_is_lean() -> None:
    req = decide(raw())
    assert req is not None and req.length == len(BODY) and not req.close
    assert decide(raw(target="/v1/messages?beta=true")).query == "beta=true"
    assert decide(raw(headers=[*SDK_HEADERS[:4], ("Connection", "close")])).close


@pytest.mark.parametrize("case,data", [
    ("GET", raw(method="GET", body=b"", length=False)),
    ("HTTP/1.0", raw(version="1.0")),
    ("not a provider path", raw(target="/sessions")),
    ("a %-escape", raw(target="/s/pk_abc/v1/chat%2Fcompletions")),
    ("chunked", raw(headers=[*SDK_HEADERS, ("Transfer-Encoding", "chunked")], length=False)),
    ("expect", raw(headers=[*SDK_HEADERS, ("Expect", "100-continue")])),
    ("upgrade", raw(headers=[("Host", "h"), ("Connection", "Upgrade, HTTP2-Settings"), ("Upgrade", "h2c")])),
    ("underscore header", raw(headers=[*SDK_HEADERS, ("X_Api_Key", "pk_other")])),
    ("forwarded", raw(headers=[*SDK_HEADERS, ("X-Forwarded-For", "10.0.0.1")])),
    ("forwarded proto", raw(headers=[*SDK_HEADERS, ("X-Forwarded-Proto", "https")])),
    ("two content-lengths", raw(headers=[*SDK_HEADERS, ("Content-Length", str(len(BODY)))])),
    ("two hosts", raw(headers=[*SDK_HEADERS, ("Host", "evil")])),
    ("no content-length", raw(length=False)),
    ("a signed content-length", raw(headers=[*SDK_HEADERS, ("Content-Length", f"+{len(BODY)}")], length=False)),
])
def test_anything_else_is_gunicorns(case: str, data: bytes) -> None:
    assert decide(data) is None, case


def test_a_body_over_the_limit_is_gunicorns() -> None:
    assert decide(raw(), max_body=len(BODY) - 1) is None
    assert decide(raw(), max_body=len(BODY)) is not None


def gunicorn_environ(data: bytes) -> dict:
    cfg = Config()
    req = next(iter(RequestParser(cfg, [data], ("127.0.0.1", 5555))))
    _, environ = wsgi.create(req, object(), ("127.0.0.1", 5555), ("127.0.0.1", 8600), cfg)
    return environ


@pytest.mark.parametrize("target", ["/s/pk_abc/v1/chat/completions", "/v1/messages?beta=true&x=1"])
def test_the_environ_is_gunicorns(target: str) -> None:
    data = raw(target=target)
    parsed = parse_request(data)
    req = lean_worker.lean_request(parsed, 1 << 20)
    assert req is not None
    ours = lean_worker.environ_for(req, BODY, {}, object(), ("127.0.0.1", 5555), ("127.0.0.1", 8600))
    theirs = gunicorn_environ(data)
    keys = {k for k in theirs if k.startswith("HTTP_")} | {
        "REQUEST_METHOD", "PATH_INFO", "QUERY_STRING", "RAW_URI", "SCRIPT_NAME", "SERVER_PROTOCOL",
        "CONTENT_LENGTH", "CONTENT_TYPE", "REMOTE_ADDR", "REMOTE_PORT", "SERVER_NAME", "SERVER_PORT"}
    assert {k: ours.get(k) for k in keys} == {k: theirs.get(k) for k in keys}
    assert {k for k in ours if k.startswith("HTTP_")} == {k for k in theirs if k.startswith("HTTP_")}
    assert ours["HTTP_ANTHROPIC_BETA"] == "a,b,c"  # repeated headers joined as gunicorn joins them
    assert ours["wsgi.input"].read() == BODY
    assert ours[lean_worker.BODY_IN_MEMORY] is True  # read whole: FastPath may admit before parsing it


class Gather:
    def __init__(self) -> None:
        self.data = b""

    def sendall(self, data: bytes) -> None:
        self.data += data


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("close", [False, True])
def test_the_reply_head_is_gunicorns(chunked: bool, close: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(util, "http_date", lambda timestamp=None: "Thu, 01 Jan 1970 00:00:00 GMT")
    headers = [("Content-Type", "application/json")] + ([] if chunked else [("Content-Length", "2")])
    if close:
        head = [("Host", "h"), ("Connection", "close"), ("Content-Length", "2")]
    else:
        head = [("Host", "h"), ("Content-Length", "2")]
    data = raw(headers=head, body=b"{}", length=False)
    cfg = Config()
    req = next(iter(RequestParser(cfg, [data], ("127.0.0.1", 5))))
    sock = Gather()
    resp, _ = wsgi.create(req, sock, ("127.0.0.1", 5), ("127.0.0.1", 80), cfg)
    resp.start_response("200 OK", headers)
    resp.write(b"{}")
    resp.close()
    ours = lean_worker.reply_head("200 OK", headers, close, chunked)
    assert sock.data.startswith(ours)
    assert sock.data == ours + (b"2\r\n{}\r\n0\r\n\r\n" if chunked else b"{}")


def test_replay_socket_gives_back_what_was_read_first() -> None:
    a, b = socket.socketpair()
    try:
        b.sendall(b"world")
        replay = lean_worker.ReplaySocket(a, b"hello ")
        assert replay.recv(3) == b"hel" and replay.recv(100) == b"lo " and replay.recv(100) == b"world"
        assert replay.fileno() == a.fileno()
    finally:
        a.close()
        b.close()


# --- through the served gateway (gunicorn with the lean worker, as shipped) ---------------------

def exchange(sock: socket.socket, data: bytes, replies: int = 1) -> list[tuple[bytes, bytes]]:
    """Send `data`, read `replies` HTTP replies (sized or chunked) off a keep-alive socket."""
    buf = b""
    out = []
    sock.sendall(data)
    while len(out) < replies:
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(65536)
            assert chunk, f"connection closed after {len(out)} replies: {buf!r}"
            buf += chunk
        head, _, buf = buf.partition(b"\r\n\r\n")
        fields = {ln.split(b":", 1)[0].strip().lower(): ln.split(b":", 1)[1].strip()
                  for ln in head.split(b"\r\n")[1:]}
        if head.startswith(b"HTTP/1.1 100"):
            continue
        if b"content-length" in fields:
            n = int(fields[b"content-length"])
            while len(buf) < n:
                buf += sock.recv(65536)
            body, buf = buf[:n], buf[n:]
        else:
            assert fields.get(b"transfer-encoding") == b"chunked", head
            body = b""
            while True:
                while b"\r\n" not in buf:
                    buf += sock.recv(65536)
                size_line, _, buf = buf.partition(b"\r\n")
                size = int(size_line, 16)
                while len(buf) < size + 2:
                    buf += sock.recv(65536)
                body, buf = body + buf[:size], buf[size + 2:]
                if size == 0:
                    break
        out.append((head, body))
    return out


def connect(gateway) -> socket.socket:
    host, port = gateway.url.rsplit("/", 1)[-1].split(":")
    return socket.create_connection((host, int(port)), timeout=30)


def post(key: str, body: bytes = BODY, extra: list[tuple[str, str]] | None = None,
         path: str = "/v1/chat/completions") -> bytes:
    headers = [("Host", "gw"), ("Content-Type", "application/json"), ("Authorization", f"Bearer {key}"),
               *(extra or [])]
    return raw(target=path, headers=headers, body=body)


def test_one_connection_lean_then_gunicorn(gateway, session) -> None:
    """A lean call, pipelined lean calls, then a GET (gunicorn's), then a call again (gunicorn's
    from then on): every reply right and in order, on one connection."""
    key = session["key"]
    with connect(gateway) as sock:
        (head, body), = exchange(sock, post(key))
        assert head.startswith(b"HTTP/1.1 200") and b"Connection: keep-alive" in head
        assert json.loads(body)["choices"][0]["message"]["content"]
        two = exchange(sock, post(key) + post(key, path="/v1/messages"), replies=2)
        assert [h.split(b"\r\n")[0] for h, _ in two] == [b"HTTP/1.1 200 OK"] * 2
        assert json.loads(two[0][1])["object"] == "chat.completion" and json.loads(two[1][1])["type"] == "message"
        health = b"GET /health HTTP/1.1\r\nHost: gw\r\n\r\n"
        (head, body), = exchange(sock, health)
        assert head.startswith(b"HTTP/1.1 200") and "upstreams" in json.loads(body)
        (head, body), = exchange(sock, post(key))
        assert head.startswith(b"HTTP/1.1 200") and json.loads(body)["object"] == "chat.completion"
    assert len(gateway.calls(session["session_id"])) == 4


def test_requests_with_gunicorns_headers_are_served_by_gunicorn(gateway, session) -> None:
    key = session["key"]
    with connect(gateway) as sock:
        (head, body), = exchange(sock, post(key, extra=[("Expect", "100-continue")]))
        assert head.startswith(b"HTTP/1.1 200"), head
        chunked = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
                   b"Authorization: Bearer " + key.encode() + b"\r\nTransfer-Encoding: chunked\r\n\r\n"
                   + b"%X\r\n" % len(BODY) + BODY + b"\r\n0\r\n\r\n")
        (head, body), = exchange(sock, chunked)
        assert head.startswith(b"HTTP/1.1 200") and json.loads(body)["object"] == "chat.completion"


def test_an_underscore_header_never_carries_a_key(gateway, session) -> None:
    """gunicorn drops header names with "_" (else X_API_KEY would pose as X-API-Key); a request
    with one goes to gunicorn, whose answer is 401 here: the key never counts."""
    headers = [("Host", "gw"), ("Content-Type", "application/json"), ("X_Api_Key", session["key"])]
    with connect(gateway) as sock:
        (head, body), = exchange(sock, raw(target="/v1/chat/completions", headers=headers))
    assert head.startswith(b"HTTP/1.1 401"), head


def test_a_bad_request_gets_gunicorns_error(gateway) -> None:
    with connect(gateway) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: 1x\r\n\r\n{}")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 400") and b"application/problem+json" in data


def test_a_streamed_call_is_chunked_frame_by_frame(gateway, session) -> None:
    body = json.dumps({"model": "m", "max_tokens": 8, "stream": True,
                       "messages": [{"role": "user", "content": "hi polar:notool"}]}).encode()
    with connect(gateway) as sock:
        (head, stream), = exchange(sock, post(session["key"], body=body))
        assert b"Transfer-Encoding: chunked" in head and b"text/event-stream" in head
        assert stream.rstrip().endswith(b"data: [DONE]")
        (head, again), = exchange(sock, post(session["key"]))  # the connection goes on
        assert head.startswith(b"HTTP/1.1 200")


def test_a_half_sent_head_does_not_block_other_connections(gateway, session) -> None:
    """A connection waiting on the rest of its head holds only its own greenlet."""
    with connect(gateway) as slow, connect(gateway) as fast:
        slow.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n")  # a head never finished
        t = time.monotonic()
        (head, _), = exchange(fast, post(session["key"]))
        assert head.startswith(b"HTTP/1.1 200") and time.monotonic() - t < 10


def test_the_served_gateway_runs_the_lean_path(gateway) -> None:
    import requests

    assert requests.get(f"{gateway.url}/health", timeout=10).json()["http"] == "lean"
