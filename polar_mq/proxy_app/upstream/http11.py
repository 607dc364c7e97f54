"""A lean HTTP/1.1 client for the gateway's calls to vLLM: keep-alive pooling, plain and streamed
bodies (Content-Length, chunked, or read to close), and an abort that really closes the socket.

Why not requests: on the gateway's hot path requests/urllib3/http.client cost more CPU than the
gateway's own work (building a PreparedRequest, merging settings, urllib3's pool and retry
bookkeeping and http.client's header parsing per call, and again per streamed chunk in urllib3's
read1). This client writes the request head and body in one send and parses the
answer with a few bytes operations. It is plain blocking socket code, so under the gevent
worker (monkey-patched sockets) every wait is cooperative, and under threads it is thread-safe.

Semantics kept from requests as the upstream pool uses it:
- `connect_timeout` bounds the TCP connect, `timeout` every wait for bytes after it;
- a connection is reused only after its answer was read to the end and the server allows it
  (HTTP/1.1 without `Connection: close`); an idle connection that the server closed (readable
  while idle) is dropped before use; a request whose reused connection dies before the first byte
  of the answer is sent once more on a fresh connection (what http clients do for a stale
  keep-alive connection: the server never saw it as a request);
- `close()` of a response that is not finished shuts the socket down (vLLM aborts a generation
  whose connection closes), also while another thread or greenlet is blocked reading it.

Only plain http without a proxy: the pool keeps requests for https upstreams and for upstreams
behind an environment proxy (upstream.py).

Tests: tests/gateway/test_http11.py.
"""

from __future__ import annotations

import ipaddress
import socket
from collections import deque
from typing import Any, Callable

from polar_mq._io.fast_send import send_all
from polar_mq._io.idle_socket import has_data, idle_and_open
from polar_mq._io.locks import short_lock
from polar_mq.proxy_app import fastjson

MAX_HEAD = 65536  # bytes of status line + headers accepted
RECV = 65536
SEND_BUFFER = 512 * 1024


class HttpError(Exception):
    """The transport failed (not an HTTP error status: those are answers)."""


class ConnectError(HttpError):
    """The upstream could not be reached (resolution, refused, connect timeout)."""


class ReadTimeout(HttpError):
    """The upstream stopped sending within the read timeout."""


class ProtocolError(HttpError):
    """The connection broke or the answer was not HTTP/1.x."""


class _Conn:
    __slots__ = ("sock", "buf", "key", "reused")

    def __init__(self, sock: socket.socket, key: tuple[str, int]):
        self.sock = sock
        self.buf = b""
        self.key = key
        self.reused = False

    def recv(self) -> bytes:
        try:
            data = self.sock.recv(RECV)
        except socket.timeout as exc:
            raise ReadTimeout(f"read timed out: {exc}") from None
        except OSError as exc:
            raise ProtocolError(f"connection broke: {exc}") from None
        return data

    def kill(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass


class Response:
    """An answer: status and headers read; the body as a whole (`content`) or piece by piece
    (`read1`, decoded from the chunked framing). `raw` is the response itself (requests' shape).
    It is a `transports.Reply` that can idle."""

    can_idle = True

    def __init__(self, pool: "Http11Pool", conn: _Conn, status: int, reason: str,
                 headers: dict[str, str], keep_alive: bool):
        self._pool = pool
        self._conn: _Conn | None = conn
        self._lock = short_lock()
        self.status_code = status
        self.reason = reason
        self.headers = headers
        self._keep = keep_alive
        te = headers.get("transfer-encoding", "").lower()
        self._chunked = "chunked" in te
        length = headers.get("content-length")
        self._left: int | None = None  # bytes of a Content-Length body still to come
        if not self._chunked and length is not None:
            try:
                self._left = int(length)
            except ValueError:
                raise ProtocolError(f"bad Content-Length {length!r}") from None
        elif not self._chunked:
            self._keep = False  # read to close
        if status in (204, 304) or 100 <= status < 200:
            self._left = 0
            self._chunked = False
        self._chunk_left = 0  # chunked: data bytes of the current chunk still to come
        self._state = "size"  # chunked: size | data | crlf
        self._done = False
        self._content: bytes | None = None
        if self._left == 0:
            self._finish()

    @property
    def raw(self) -> "Response":
        return self

    @property
    def ok(self) -> bool:
        return self.status_code < 400

    def read_timeout(self) -> float:
        """The pool's limit on one wait for bytes (s)."""
        return self._pool.timeout

    def set_read_timeout(self, seconds: float) -> None:
        """Wait at most `seconds` for bytes from now on (a ReadTimeout then leaves the answer
        readable: nothing was taken from it). The pool resets it when the connection is reused."""
        conn = self._conn
        if conn is not None:
            conn.sock.settimeout(seconds)

    def arrived(self) -> bool:
        """Whether more of the answer has arrived (a read would not wait): one non-blocking peek."""
        conn = self._conn
        return conn is not None and has_data(conn.sock)

    # --- body -------------------------------------------------------------------------------
    def _finish(self) -> None:
        """The body was read to its end: the connection goes back to the pool (or is closed)."""
        self._done = True
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            if self._keep and not conn.buf:
                self._pool._release(conn)
            else:
                conn.kill()

    def _fill(self, conn: _Conn) -> bool:
        data = conn.recv()
        if not data:
            return False
        conn.buf += data
        return True

    def read1(self, n: int = RECV) -> bytes:
        """The next decoded body bytes (whatever has arrived, at least one byte), b"" at the end."""
        while True:
            if self._done:
                return b""
            conn = self._conn
            if conn is None:
                raise ProtocolError("response closed")
            if self._chunked:
                out = self._decode_chunks(conn)
                if out or self._done:
                    return out
            elif conn.buf:
                data = conn.buf
                if self._left is not None:
                    data = data[:self._left]
                    self._left -= len(data)
                conn.buf = conn.buf[len(data):]
                if self._left == 0:
                    self._finish()
                return data
            if not self._fill(conn):
                if self._left is None and not self._chunked:  # read to close: this is the end
                    self._finish()
                    return b""
                raise ProtocolError("connection closed before the answer ended")

    def _decode_chunks(self, conn: _Conn) -> bytes:
        """Every complete piece of chunked data in the buffer (b"" when more must arrive)."""
        out: list[bytes] = []
        buf = conn.buf
        pos = 0
        while True:
            if self._state == "size":
                start = pos
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    if len(buf) - pos > 4096:
                        raise ProtocolError("chunk size line too long")
                    break
                line = buf[pos:end].split(b";", 1)[0].strip()
                try:
                    size = int(line, 16)
                except ValueError:
                    raise ProtocolError(f"bad chunk size {line[:40]!r}") from None
                pos = end + 2
                if size == 0:  # the last chunk; then trailers (usually none) and an empty line
                    if buf[pos:pos + 2] == b"\r\n":
                        pos += 2
                    else:
                        tail = buf.find(b"\r\n\r\n", pos)
                        if tail < 0:
                            pos = start  # wait for the rest, then read this line again
                            break
                        pos = tail + 4
                    conn.buf = buf[pos:]
                    self._finish()
                    return b"".join(out)
                self._chunk_left = size
                self._state = "data"
            elif self._state == "data":
                if pos >= len(buf):
                    break
                take = min(self._chunk_left, len(buf) - pos)
                out.append(buf[pos:pos + take])
                pos += take
                self._chunk_left -= take
                if self._chunk_left == 0:
                    self._state = "crlf"
            else:  # crlf after the data
                if len(buf) - pos < 2:
                    break
                if buf[pos:pos + 2] != b"\r\n":
                    raise ProtocolError("chunk not followed by CRLF")
                pos += 2
                self._state = "size"
        conn.buf = buf[pos:]
        return b"".join(out)

    @property
    def content(self) -> bytes:
        if self._content is None:
            parts = []
            while True:
                piece = self.read1()
                if not piece:
                    break
                parts.append(piece)
            self._content = b"".join(parts)
        return self._content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        return fastjson.loads(self.content)

    def finish_within(self, seconds: float, max_bytes: int = RECV) -> bool:
        """Read what is left of the body if it comes within `seconds` (at most `max_bytes`), so
        that the connection goes back to the pool; else close it. For a stream whose last event
        was read: an SSE reader stops at `data: [DONE]`; when the chunked terminator had not come
        in the same read, closing there threw the kept-alive connection away (vLLM usually sends
        both together; tests/gateway/test_http11.py has a server that does not). Returns whether the
        connection was kept."""
        conn = self._conn
        if self._done:
            return True
        if conn is None or (self._left is None and not self._chunked):
            self.close()
            return False
        drained = 0
        try:
            conn.sock.settimeout(seconds)
            while not self._done and drained <= max_bytes:
                drained += len(self.read1())
        except (HttpError, OSError):
            pass
        if not self._done:
            self.close()
            return False
        return True

    def close(self) -> None:
        """Give up the answer: an unfinished one closes its connection (the upstream sees the
        client leave); safe from another thread or greenlet, and more than once."""
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.kill()


def _split(root: str) -> tuple[str, int]:
    rest = root.split("://", 1)[1].split("/", 1)[0]
    if rest.startswith("["):
        host, _, port = rest[1:].partition("]")
        port = port.lstrip(":")
    else:
        host, _, port = rest.rpartition(":") if ":" in rest else (rest, "", "")
    return host, int(port) if port else 80


class Http11Pool:
    """Kept-alive connections per (host, port); requests go out on an idle one or a new one."""

    def __init__(self, connect_timeout: float = 5.0, timeout: float = 600.0, max_idle: int = 1024):
        self.connect_timeout = connect_timeout
        self.timeout = timeout
        self.max_idle = max_idle
        self._idle: dict[tuple[str, int], deque[_Conn]] = {}
        self._addr: dict[str, tuple[int, str] | None] = {}
        self.on_connect: Callable[[str], None] | None = None  # a new connection to root (metrics)

    def _connect(self, key: tuple[str, int]) -> _Conn:
        host, port = key
        if host in self._addr:
            literal = self._addr[host]
        else:
            try:
                ip = ipaddress.ip_address(host)
                literal = self._addr[host] = (socket.AF_INET6 if ip.version == 6 else socket.AF_INET, host)
            except ValueError:
                literal = self._addr[host] = None
        try:
            if literal is not None:  # an IP address: no resolver round (a thread pool under gevent)
                sock = socket.socket(literal[0], socket.SOCK_STREAM)
                sock.settimeout(self.connect_timeout)
                try:
                    sock.connect((literal[1], port))
                except BaseException:
                    sock.close()
                    raise
            else:
                sock = socket.create_connection((host, port), timeout=self.connect_timeout)
        except socket.timeout as exc:
            raise ConnectError(f"connect to {host}:{port} timed out: {exc}") from None
        except OSError as exc:
            raise ConnectError(f"cannot connect to {host}:{port}: {exc}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # A send buffer that takes an agent's request at once: from the 16 KB a connection starts
        # with, gevent's sendall waits for the upstream to drain it several times per 80 KB
        # request, each wait a switch of the hub. The kernel caps it at net.core.wmem_max (x2).
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        sock.settimeout(self.timeout)
        if self.on_connect is not None:
            self.on_connect(f"http://{host}:{port}" if ":" not in host else f"http://[{host}]:{port}")
        return _Conn(sock, key)

    def _idle_conn(self, key: tuple[str, int]) -> _Conn | None:
        idle = self._idle.get(key)
        while idle:
            try:
                conn = idle.pop()
            except IndexError:
                return None
            if not idle_and_open(conn.sock):  # the server closed it (or sent junk): not reusable
                conn.kill()
                continue
            conn.reused = True
            conn.sock.settimeout(self.timeout)  # finish_within may have shortened it
            return conn
        return None

    def _release(self, conn: _Conn) -> None:
        idle = self._idle.setdefault(conn.key, deque())
        if len(idle) < self.max_idle:
            idle.append(conn)
        else:
            conn.kill()

    def request(self, method: str, root: str, path: str, body: bytes = b"",
                headers: dict[str, str] | None = None) -> Response:
        """Send one request to `root` (http://host:port) and read the answer's head; the body is
        read through the Response (`content`, `read1`)."""
        key = _split(root)
        host = key[0] if key[1] == 80 else f"{key[0]}:{key[1]}"
        if ":" in key[0]:
            host = f"[{key[0]}]" if key[1] == 80 else f"[{key[0]}]:{key[1]}"
        head = [f"{method} {path} HTTP/1.1", f"Host: {host}", "User-Agent: polar-mq-gateway",
                "Accept: */*", "Accept-Encoding: identity", "Connection: keep-alive"]
        for name, value in (headers or {}).items():
            head.append(f"{name}: {value}")
        if body or method in ("POST", "PUT", "PATCH"):
            head.append(f"Content-Length: {len(body)}")
        wire = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
        conn = self._idle_conn(key)
        if conn is not None:
            try:
                return self._exchange(conn, wire)
            except _Stale:
                pass  # the server dropped the kept-alive connection: once more, on a new one
        try:
            return self._exchange(self._connect(key), wire)
        except _Stale as exc:
            raise ProtocolError(str(exc)) from None

    def _exchange(self, conn: _Conn, wire: bytes) -> Response:
        try:
            send_all(conn.sock, wire)
        except socket.timeout as exc:
            conn.kill()
            raise ReadTimeout(f"send timed out: {exc}") from None
        except OSError as exc:
            conn.kill()
            raise _Stale(f"connection broke while sending: {exc}") from None
        try:
            return self._read_head(conn)
        except _Stale:
            conn.kill()
            raise
        except BaseException:
            conn.kill()
            raise

    def _read_head(self, conn: _Conn) -> Response:
        while True:
            end = conn.buf.find(b"\r\n\r\n")
            if end >= 0:
                break
            if len(conn.buf) > MAX_HEAD:
                raise ProtocolError("answer head too large")
            try:
                data = conn.recv()
            except ProtocolError as exc:
                if not conn.buf:
                    raise _Stale(str(exc)) from None
                raise
            if not data:
                if not conn.buf:
                    raise _Stale("connection closed before the answer")
                raise ProtocolError("connection closed in the answer's head")
            conn.buf += data
        head = conn.buf[:end].decode("latin-1")
        conn.buf = conn.buf[end + 4:]
        lines = head.split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
            raise ProtocolError(f"not an HTTP/1.x answer: {lines[0][:80]!r}")
        try:
            status = int(parts[1])
        except ValueError:
            raise ProtocolError(f"bad status line {lines[0][:80]!r}") from None
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                name = name.strip().lower()
                value = value.strip()
                headers[name] = f"{headers[name]}, {value}" if name in headers else value
        if 100 <= status < 200 and status != 101:  # interim answer (100 Continue): read the next
            return self._read_head(conn)
        keep = parts[0] == "HTTP/1.1" and "close" not in headers.get("connection", "").lower()
        return Response(self, conn, status, parts[2] if len(parts) > 2 else "", headers, keep)

    def close(self) -> None:
        for idle in self._idle.values():
            while idle:
                idle.pop().kill()


class _Stale(Exception):
    """A connection that died before any byte of the answer (safe to send the request again)."""
