"""What a sandbox may say to the gateway: its own session's provider endpoints, nothing else.

The bridge that carries a sandbox's connections to the gateway (netbridge) must not relay bytes
blindly: an agent could then call ``/sessions`` (list other sessions' calls, fetch keys) or
another session's ``/s/<key>`` endpoints, and pipeline more requests after an allowed one. The
bridge reads each request's head, lets it through only when it is for this session (the ``/s/<key>``
prefix, or the key as the API key on a provider path) and never for the gateway's own resources
(``/sessions``, ``/health``), and forwards exactly one request per connection (``Connection:
close``; the body by its Content-Length or chunked framing), so nothing can be smuggled behind an
allowed request. Refusals are a 403 the harness can read (tests/trust/test_trust_sandbox.py).
"""

from __future__ import annotations

import json
import re
import socket
from dataclasses import dataclass
from typing import Callable
from urllib.parse import parse_qs, urlsplit

from polar_mq.auth import bearer, equal

MAX_HEAD = 64 * 1024
KEY_IN_URL = re.compile(r"/s/([^/?#]+)")
ADMIN_PATHS = ("/sessions", "/health", "/metrics")


def key_from_urls(urls: list[str]) -> str | None:
    """The session key of a session's base URLs (``http://gw/s/<key>[/v1]``)."""
    for url in urls:
        m = KEY_IN_URL.match(urlsplit(url).path)
        if m:
            return m.group(1)
    return None


@dataclass
class RequestHead:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]

    def header(self, name: str) -> str | None:
        name = name.lower()
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return None

    def encode(self) -> bytes:
        """The head as forwarded: one request per connection (keep-alive headers replaced)."""
        drop = {"connection", "keep-alive", "proxy-connection"}
        lines = [f"{self.method} {self.target} {self.version}"]
        lines += [f"{k}: {v}" for k, v in self.headers if k.lower() not in drop]
        lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def parse_head(data: bytes) -> RequestHead | None:
    try:
        text = data.decode("latin-1")
        request_line, *lines = text.split("\r\n")
        method, target, version = request_line.split(" ")
    except ValueError:
        return None
    headers = []
    for line in lines:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            return None
        headers.append((name, value.strip()))
    return RequestHead(method, target, version, headers)


class SessionGuard:
    """Decides, per request, whether it belongs to the session with this key."""

    def __init__(self, key: str):
        self.key = key

    def allows(self, head: RequestHead) -> bool:
        parts = urlsplit(head.target)
        path = parts.path
        m = KEY_IN_URL.match(path)
        if m:
            return equal(m.group(1), self.key)
        if path.startswith(ADMIN_PATHS) or path == "/":
            return False
        given = [head.header("x-api-key"), head.header("x-goog-api-key"), bearer(head.header("authorization")),
                 *parse_qs(parts.query).get("key", [])]
        return any(equal(g, self.key) for g in given if g)


def _read_head(sock: socket.socket) -> tuple[bytes, bytes] | None:
    buf = b""
    while b"\r\n\r\n" not in buf:
        if len(buf) > MAX_HEAD:
            return None
        chunk = sock.recv(65536)
        if not chunk:
            return None
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    return head, rest


def _refuse(sock: socket.socket, status: str, message: str) -> None:
    body = json.dumps({"error": {"message": message, "type": "permission_error", "code": "sandbox_forbidden"}})
    try:
        sock.sendall(f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                     f"Connection: close\r\n\r\n{body}".encode())
    except OSError:
        pass


class _Reader:
    """Buffered reads from the client after the head."""

    def __init__(self, sock: socket.socket, pending: bytes):
        self.sock, self.buf = sock, pending

    def take(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("client closed mid-body")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def line(self) -> bytes:
        while b"\r\n" not in self.buf:
            if len(self.buf) > MAX_HEAD:
                raise ConnectionError("chunk header too long")
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("client closed mid-body")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line + b"\r\n"


def _forward_body(head: RequestHead, reader: _Reader, send: Callable[[bytes], None]) -> None:
    """Exactly the body of this one request, by its framing."""
    if (head.header("transfer-encoding") or "").lower() == "chunked":
        while True:
            size_line = reader.line()
            send(size_line)
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while True:  # trailers, up to the empty line
                    trailer = reader.line()
                    send(trailer)
                    if trailer == b"\r\n":
                        return
            remaining = size + 2
            while remaining:
                piece = reader.take(min(remaining, 65536))
                send(piece)
                remaining -= len(piece)
        return
    remaining = int(head.header("content-length") or 0)
    while remaining:
        piece = reader.take(min(remaining, 65536))
        send(piece)
        remaining -= len(piece)


def guarded_relay(client: socket.socket, connect: Callable[[], socket.socket], guard: SessionGuard,
                  pipe: Callable[[socket.socket, socket.socket], None]) -> None:
    """Relay one request from `client` if `guard` allows it, then the whole answer back."""
    import threading

    upstream = None
    try:
        got = _read_head(client)
        head = parse_head(got[0]) if got else None
        if got is None or head is None:
            _refuse(client, "400 Bad Request", "malformed HTTP request")
            return
        if head.header("content-length") and head.header("transfer-encoding"):
            _refuse(client, "400 Bad Request", "both Content-Length and Transfer-Encoding")
            return
        if not guard.allows(head):
            _refuse(client, "403 Forbidden", "a sandbox reaches only its own session's model endpoints")
            return
        upstream = connect()
        upstream.sendall(head.encode())
        back = threading.Thread(target=pipe, args=(upstream, client), daemon=True)
        back.start()  # the answer (a 100 Continue too) flows while the body goes up
        _forward_body(head, _Reader(client, got[1]), upstream.sendall)
        back.join()
    except (OSError, ConnectionError, ValueError):
        pass
    finally:
        for s in (client, upstream):
            if s is not None:
                try:
                    s.close()
                except OSError:
                    pass
