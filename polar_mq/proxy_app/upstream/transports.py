"""How a request reaches an upstream: one `Transport` per upstream, chosen once when the pool is
built (`transport_for`), so the pool never asks which client it holds.

- `LeanTransport` (http11.py): plain-http upstreams that no environment proxy applies to. Its
  replies can idle (a read timeout leaves the answer readable) and see the socket (`arrived`).
- `RequestsTransport`: https and proxied upstreams, through requests (proxies, TLS). Its replies
  cannot idle: a stream read waits until data or the read timeout.

Both raise `UpstreamTimeout` (no answer within the read timeout) or `UpstreamUnreachable`
(could not connect or send), and give a `Reply` with the same surface (tests/gateway/test_http11.py,
tests/gateway/test_gateway.py)."""

from __future__ import annotations

from typing import Any, Mapping, Protocol

import requests

from polar_mq.proxy_app.upstream import http11

# An idle-mode read that waited its interval (the lean client only): the stream reader counts it.
ReadTimeout = http11.ReadTimeout


class UpstreamTimeout(Exception):
    """The upstream did not answer within the read timeout."""


class UpstreamUnreachable(Exception):
    """The upstream could not be reached (connect or send failed)."""


class Reply(Protocol):
    status_code: int
    reason: str
    can_idle: bool  # a read timeout leaves the answer readable, and `arrived` sees the socket

    @property
    def content(self) -> bytes: ...

    @property
    def text(self) -> str: ...

    @property
    def ok(self) -> bool: ...

    def json(self) -> Any: ...

    def read1(self, n: int = ...) -> bytes: ...

    def arrived(self) -> bool: ...

    def read_timeout(self) -> float: ...

    def set_read_timeout(self, seconds: float) -> None: ...

    def finish_within(self, seconds: float) -> bool: ...

    def close(self) -> None: ...


class Transport(Protocol):
    def post(self, root: str, path: str, body: bytes, headers: Mapping[str, str], *, stream: bool) -> Reply: ...


class LeanTransport:
    def __init__(self, pool: http11.Http11Pool):
        self.pool = pool

    def post(self, root: str, path: str, body: bytes, headers: Mapping[str, str], *, stream: bool) -> Reply:
        try:
            resp = self.pool.request("POST", root, path, body, dict(headers))
            if not stream:
                resp.content  # noqa: B018 - the whole answer now, as requests reads it
            return resp
        except http11.ReadTimeout:
            raise UpstreamTimeout() from None
        except http11.HttpError as exc:
            raise UpstreamUnreachable(str(exc)) from exc


class RequestsReply:
    """A requests answer with the `Reply` surface (no idle mode: urllib3 buffers out of sight)."""

    can_idle = False

    def __init__(self, resp: requests.Response, timeout: float):
        self.resp = resp
        self.status_code = resp.status_code
        self.reason = resp.reason
        self._timeout = timeout

    @property
    def content(self) -> bytes:
        return self.resp.content

    @property
    def text(self) -> str:
        return self.resp.text

    @property
    def ok(self) -> bool:
        return self.resp.ok

    def json(self) -> Any:
        return self.resp.json()

    def read1(self, n: int = 65536) -> bytes:
        raw: Any = self.resp.raw
        return raw.read1(n) if hasattr(raw, "read1") else raw.read(1)

    def arrived(self) -> bool:
        return False

    def read_timeout(self) -> float:
        return self._timeout

    def set_read_timeout(self, seconds: float) -> None:
        raise NotImplementedError("requests replies have no idle mode (can_idle is False)")

    def finish_within(self, seconds: float) -> bool:
        self.close()
        return False

    def close(self) -> None:
        self.resp.close()


class RequestsTransport:
    def __init__(self, session: requests.Session, connect_timeout: float, timeout: float):
        self.session = session
        self.connect_timeout = connect_timeout
        self.timeout = timeout

    def post(self, root: str, path: str, body: bytes, headers: Mapping[str, str], *, stream: bool) -> Reply:
        try:
            resp = self.session.post(f"{root}{path}", data=body, headers=dict(headers), stream=stream,
                                     timeout=(self.connect_timeout, self.timeout))
        except requests.exceptions.ReadTimeout:
            raise UpstreamTimeout() from None
        except requests.exceptions.RequestException as exc:
            raise UpstreamUnreachable(str(exc)) from exc
        return RequestsReply(resp, self.timeout)


def transport_for(root: str, lean: LeanTransport, plain: RequestsTransport) -> Transport:
    """The lean client where it applies (plain http, no environment proxy), requests elsewhere."""
    if root.startswith("http://") and not requests.utils.get_environ_proxies(root):
        return lean
    return plain
