"""A gunicorn gevent worker that serves the gateway's common request itself, and hands every other
request, with the bytes already read, to gunicorn's own HTTP/1.1 handling.

Why: gunicorn's request handling is a large share of the worker's CPU per call even with its C
parser (gunicorn_h1c): per request it runs Python over every header twice (the header policy
while parsing, then the WSGI environ), builds a Response object, formats the Date, and checks the
peer against forwarded_allow_ips, while the C parse alone is a small fraction of that (figures:
docs/benchmarks.md). SDK clients and harnesses send one request shape almost always — a POST
with a Content-Length to a provider path, over a kept-alive HTTP/1.1 connection — and the
gateway's FastPath (fastpath.py) already serves those without Flask.

So this worker parses each request head with gunicorn's C parser, called exactly as gunicorn calls
it (same limits), and takes the request only when it is that plain shape (`lean_request`):
  * POST, HTTP/1.1, a path FastPath serves (no %-escapes, no fragment), one numeric
    Content-Length within the body limit;
  * none of the headers where gunicorn has a policy of its own: Transfer-Encoding, Expect,
    Upgrade, HTTP2-Settings, Forwarded / X-Forwarded-* and the other forwarded-scheme headers,
    a repeated Host or Content-Type, any header name with "_" (gunicorn drops those so they
    cannot pose as CGI variables).
It then reads the body, builds the WSGI environ FastPath reads, calls FastPath, and writes the
reply with the head gunicorn writes (Server, Date, Connection), a sized reply in one write and a
streamed one chunked, frame by frame.

Every other request — any method or path FastPath does not serve, a chunked upload, a request
gunicorn would refuse (it parses the same bytes again and answers its own error) — goes to
gunicorn: the connection continues in `AsyncWorker.handle` over `ReplaySocket`, which gives back
the bytes read so far first. So a client sees gunicorn's behaviour for everything but the plain
provider call, and for that one the same reply bytes gunicorn writes (tests/gateway/test_lean_worker.py).

What the lean path does not run: gunicorn's pre_request/post_request hooks and access log (the
gateway configures neither). Set POLAR_GATEWAY_LEAN_HTTP=0 (or `--no-lean-http`) to serve every
request through gunicorn.
"""

from __future__ import annotations

import errno
import io
import logging
import sys
from typing import Any, Callable, Iterable

import gevent
from gunicorn import SERVER, util
from gunicorn.workers.ggevent import GeventWorker

from polar_mq._io.fast_send import send_all
from polar_mq.proxy_app.web.fastpath import BODY_IN_MEMORY, FastPath
from polar_mq.proxy_app.web.routes import provider_route

log = logging.getLogger("polar_mq.gateway")

# Headers gunicorn applies a policy to (or that change the message framing): a request that has
# one is served by gunicorn.
GUNICORN_HEADERS = frozenset((
    b"transfer-encoding", b"expect", b"upgrade", b"http2-settings", b"te", b"trailer",
    b"forwarded", b"x-forwarded-for", b"x-forwarded-proto", b"x-forwarded-protocol",
    b"x-forwarded-ssl", b"x-forwarded-host", b"x-forwarded-port", b"x-forwarded-prefix",
    b"x-real-ip", b"front-end-https", b"x-scheme", b"x-url-scheme", b"proxy",
))
SINGLETONS = frozenset((b"host", b"content-type", b"content-length"))
READ_SIZE = 65536


class ReplaySocket:
    """The client's socket, whose first reads give back bytes the lean path read but did not
    take; everything else is the socket's own (`socket_under`)."""

    def __init__(self, sock: Any, pending: bytes) -> None:
        self.socket_under = sock
        self._pending = pending

    def recv(self, size: int, *flags: int) -> bytes:
        if self._pending:
            out, self._pending = self._pending[:size], self._pending[size:]
            return out
        return self.socket_under.recv(size, *flags)

    def recv_into(self, buffer: Any, nbytes: int = 0, *flags: int) -> int:
        if self._pending:
            n = min(len(buffer) if not nbytes else nbytes, len(self._pending))
            buffer[:n] = self._pending[:n]
            self._pending = self._pending[n:]
            return n
        return self.socket_under.recv_into(buffer, nbytes, *flags)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.socket_under, name)


class Request:
    """A request head the lean path takes: what it needs to build the environ."""

    __slots__ = ("path", "query", "raw_uri", "headers", "length", "close")

    def __init__(self, path: str, query: str, raw_uri: str, headers: list[tuple[str, str]],
                 length: int, close: bool) -> None:
        self.path, self.query, self.raw_uri = path, query, raw_uri
        self.headers, self.length, self.close = headers, length, close


def lean_request(parsed: dict[str, Any], max_body: int) -> Request | None:
    """The request when the lean path may serve it (module docstring), else None."""
    if parsed["method"] != b"POST" or parsed["minor_version"] != 1:
        return None
    target: bytes = parsed["path"]
    if not target.startswith(b"/") or b"%" in target or b"#" in target:
        return None
    path, _, query = target.partition(b"?")
    path_str = path.decode("latin-1")
    if not routes(path_str):
        return None
    length = -1
    close = False
    seen: set[bytes] = set()
    headers: list[tuple[str, str]] = []
    for raw_name, raw_value in parsed["headers"]:
        name = raw_name.lower()
        if name in GUNICORN_HEADERS or b"_" in name:
            return None
        if name in SINGLETONS:
            if name in seen:
                return None
            seen.add(name)
            if name == b"content-length":
                value = raw_value.strip()
                if not value.isdigit():
                    return None
                length = int(value)
        elif name == b"connection":
            tokens = {t.strip() for t in raw_value.lower().split(b",")}
            if tokens - {b"keep-alive", b"close", b""}:
                return None  # upgrade and the like: gunicorn's
            close = close or b"close" in tokens
        headers.append((raw_name.decode("latin-1"), raw_value.decode("latin-1")))
    if length < 0 or length > max_body:
        return None
    return Request(path_str, query.decode("latin-1"), target.decode("latin-1"), headers, length, close)


def environ_for(req: Request, body: bytes, base: dict[str, Any], sock: Any,
                client: Any, server: Any) -> dict[str, Any]:
    """The WSGI environ gunicorn would build for `req` (the keys FastPath and Gateway read, and
    the standard ones)."""
    environ = dict(base)
    environ.update({
        "REQUEST_METHOD": "POST", "SCRIPT_NAME": "", "PATH_INFO": req.path, "QUERY_STRING": req.query,
        "RAW_URI": req.raw_uri, "SERVER_PROTOCOL": "HTTP/1.1", "wsgi.input": io.BytesIO(body), BODY_IN_MEMORY: True,
        "gunicorn.socket": sock, "CONTENT_LENGTH": str(req.length),
    })
    if isinstance(client, tuple):
        environ["REMOTE_ADDR"], environ["REMOTE_PORT"] = client[0], str(client[1])
    if isinstance(server, tuple):
        environ["SERVER_NAME"], environ["SERVER_PORT"] = server[0], str(server[1])
    for name, value in req.headers:
        key = name.upper().replace("-", "_")
        if key == "CONTENT_TYPE":
            environ[key] = value
            continue
        if key == "CONTENT_LENGTH":
            continue
        key = "HTTP_" + key
        environ[key] = f"{environ[key]},{value}" if key in environ else value
    return environ


def reply_head(status: str, headers: list[tuple[str, str]], close: bool, chunked: bool) -> bytes:
    """The head gunicorn's Response writes: status, Server, Date, Connection, then the app's."""
    parts = [f"HTTP/1.1 {status}\r\n", f"Server: {SERVER}\r\n", f"Date: {util.http_date()}\r\n",
             "Connection: close\r\n" if close else "Connection: keep-alive\r\n"]
    if chunked:
        parts.append("Transfer-Encoding: chunked\r\n")
    parts.extend(f"{k}: {v}\r\n" for k, v in headers)
    parts.append("\r\n")
    return "".join(parts).encode("latin-1")


class LeanWorker(GeventWorker):
    """gunicorn's gevent worker with the lean path in front of its request handling."""

    def init_process(self) -> None:
        self._fast: Any = None
        self._base_environ: dict[str, Any] | None = None
        super().init_process()

    def load_wsgi(self) -> None:
        super().load_wsgi()
        if self.fast_path() is not None:
            self.wsgi.config["POLAR_HTTP_PATH"] = "lean"  # /health says so

    def fast_path(self) -> Any:
        """The app's FastPath (fastpath.py), or None (then every request is gunicorn's)."""
        if self._fast is None:
            fast = getattr(self.wsgi, "wsgi_app", None)
            self._fast = fast if isinstance(fast, FastPath) else False
        return self._fast or None

    def handle(self, listener: Any, client: Any, addr: Any) -> None:
        client.setblocking(1)
        fast = self.fast_path()
        if fast is None:
            return super().handle(listener, client, addr)
        try:
            pending = self.serve_lean(fast, listener, client, addr)
        except OSError as exc:
            if exc.errno not in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, errno.EBADF):
                log.exception("socket error on the gateway's lean path")
            util.close(client)
            return
        except gevent.GreenletExit:  # the worker is stopping: as gunicorn's own handle, quietly
            util.close(client)
            raise
        except BaseException:
            log.exception("gateway lean path failed")
            util.close(client)
            raise
        if pending is None:
            util.close(client)
            return
        super().handle(listener, ReplaySocket(client, pending), addr)

    def serve_lean(self, fast: Any, listener: Any, client: Any, addr: Any) -> bytes | None:
        """Serve this connection's plain provider calls; return the bytes of the first request
        the lean path does not take (for gunicorn), or None when the connection is done."""
        from gunicorn_h1c import IncompleteError, parse_request

        cfg = self.cfg
        if not cfg.keepalive:  # one request per connection: gunicorn's own loop for that
            return b""
        limit_line = cfg.limit_request_line
        limit_line = 1024 * 1024 if limit_line == 0 else min(limit_line, 8190)
        limits = {"limit_request_line": limit_line, "limit_request_fields": cfg.limit_request_fields,
                  "limit_request_field_size": cfg.limit_request_field_size,
                  "permit_unconventional_http_method": cfg.permit_unconventional_http_method,
                  "permit_unconventional_http_version": cfg.permit_unconventional_http_version}
        max_head = limit_line + cfg.limit_request_fields * (cfg.limit_request_field_size + 2) + 4
        server = listener.getsockname()
        keepalive = cfg.keepalive
        base = self.base_environ()
        buf = b""
        while self.is_alive():
            last = 0
            parsed = None
            with gevent.Timeout(keepalive, False):
                while True:
                    if buf:
                        try:
                            parsed = parse_request(buf, last_len=last, **limits)
                            break
                        except IncompleteError:
                            if len(buf) > max_head:
                                return buf
                        except Exception:  # gunicorn parses it again and answers its own error
                            return buf
                    last = len(buf)
                    data = client.recv(READ_SIZE)
                    if not data:
                        return None
                    buf += data
            if parsed is None:  # no request within the keep-alive timeout
                return None
            if buf[:2] == b"\r\n":  # gunicorn's own handling of a leading empty line
                return buf
            req = lean_request(parsed, fast.max_body_bytes)
            if req is None:
                return buf
            consumed = parsed["consumed"]
            body = buf[consumed:consumed + req.length]
            while len(body) < req.length:
                data = client.recv(min(READ_SIZE * 16, req.length - len(body)))
                if not data:
                    return None
                body += data
            buf = buf[consumed + req.length:] if len(buf) > consumed + req.length else b""
            self.nr += 1
            if self.nr >= self.max_requests:
                if self.is_alive():
                    self.log.info("Autorestarting worker after current request.")
                self.alive = False
            close = req.close or not self.is_alive()
            environ = environ_for(req, body, base, client, addr, server)
            if not self.respond(fast, environ, client, close):
                return None
            if close:
                return None
        return None

    def is_alive(self) -> bool:
        """gunicorn's `alive` (False once the worker is told to stop: finish the request, close)."""
        return bool(self.alive)

    def base_environ(self) -> dict[str, Any]:
        if self._base_environ is None:
            self._base_environ = {
                "wsgi.errors": sys.stderr, "wsgi.version": (1, 0), "wsgi.multithread": True,
                "wsgi.multiprocess": self.cfg.workers > 1, "wsgi.run_once": False,
                "wsgi.file_wrapper": None, "wsgi.input_terminated": True, "wsgi.url_scheme": "http",
                "SERVER_SOFTWARE": SERVER,
            }
        return self._base_environ

    def respond(self, app: Callable, environ: dict[str, Any], client: Any, close: bool) -> bool:
        """Call the app and write its reply; False when the connection cannot go on."""
        started: list[Any] = []

        def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable:
            if exc_info is not None and started:
                raise exc_info[1].with_traceback(exc_info[2])
            started[:] = [status, headers]
            return _no_write

        result: Iterable[bytes] = app(environ, start_response)
        try:
            status, headers = started
            sized = any(k.lower() == "content-length" for k, _ in headers)
            if sized:
                parts = list(result)
                send_all(client, b"".join([reply_head(status, headers, close, False), *parts]))
                return True
            send_all(client, reply_head(status, headers, close, True))
            for part in result:
                if part:
                    send_all(client, b"%X\r\n%s\r\n" % (len(part), part))
            send_all(client, b"0\r\n\r\n")
            return True
        except OSError as exc:
            if exc.errno not in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, errno.EBADF):
                log.warning("client write failed: %s", exc)
            return False
        finally:
            close_result = getattr(result, "close", None)
            if close_result is not None:
                close_result()


def _no_write(data: bytes) -> None:
    raise RuntimeError("the gateway's lean path does not support the WSGI write() callable")


def routes(path: str) -> bool:
    """Whether FastPath serves a POST to `path` (routes.provider_route: the same paths)."""
    return provider_route(path) is not None
