"""gunicorn's per-request work that is the same for every request of a second or of a peer, done
once; and a sized reply's head and body in one write.

Why: gunicorn is a large share of the gateway worker's CPU per call (figures:
docs/benchmarks.md). Three parts of it repeat the same work on every request:
  * the Date header: `util.http_date()` formats the time with `email.utils` on every reply.
    Its text changes once a second, so it is formatted once a second;
  * the forwarded-header trust check: `_ip_in_allow_list` builds an `ipaddress` object from the
    peer's address and tests it against `forwarded_allow_ips` on every request. The
    answer depends only on the address and the configured networks, so it is kept per address;
  * a reply with a Content-Length goes out as two `sendall`s, its head and then its body (two
    system calls and two TCP segments for one small JSON answer). When the app hands over the
    whole body in one piece, head and body leave in one write; the bytes are unchanged
    (tests/gateway/test_gunicorn_tuning.py).

Each replaces a module attribute gunicorn itself calls through (`util.http_date`,
`http.message._ip_in_allow_list`, `http.wsgi.Response.write`) with a function that gives the
same result; `install()` is idempotent and runs in `serving.serve_wsgi` before the workers start.
tests/gateway/test_gunicorn_tuning.py holds each to gunicorn's own answer.
"""

from __future__ import annotations

import time
from typing import Any, Callable

# A gateway may serve thousands of runtimes' addresses; past this many the cache starts over.
TRUST_CACHE_SIZE = 4096

_installed = False


def cached_http_date(format_date: Callable[..., str]) -> Callable[..., str]:
    """`format_date(timestamp=None)` that formats the current time once per second."""
    last: list[Any] = [-1, ""]

    def http_date(timestamp: float | None = None) -> str:
        if timestamp is not None:
            return format_date(timestamp)
        now = int(time.time())
        if now != last[0]:
            last[1] = format_date(float(now))
            last[0] = now
        return last[1]

    return http_date


def cached_allow_list(check: Callable[[str, Any, Any], bool]) -> Callable[[str, Any, Any], bool]:
    """`check(ip, allow_list, networks)` remembered per (ip, networks). `networks` is the list
    gunicorn's Config computes once from `forwarded_allow_ips` and keeps; an entry is only used
    while that very list is the one asked about, so another config never reads a stale answer."""
    cache: dict[tuple[str, int], tuple[Any, bool]] = {}

    def ip_in_allow_list(ip_str: str, allow_list: Any, networks: Any) -> bool:
        key = (ip_str, id(networks))
        hit = cache.get(key)
        if hit is not None and hit[0] is networks:
            return hit[1]
        answer = check(ip_str, allow_list, networks)
        if len(cache) >= TRUST_CACHE_SIZE:
            cache.clear()
        cache[key] = (networks, answer)
        return answer

    return ip_in_allow_list


class _Gather:
    """A stand-in socket that keeps what gunicorn writes to it (util.write calls sendall)."""

    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        self.parts.append(data)


def one_write(write: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
    """Response.write that sends the head and a whole sized body together: when nothing is sent
    yet and `arg` is all of the Content-Length, gunicorn's own write runs against `_Gather` (its
    header and body code unchanged) and the gathered bytes go out in one sendall."""

    def whole_write(self: Any, arg: Any) -> None:
        if (self.headers_sent or self.chunked or type(arg) is not bytes
                or self.response_length != len(arg) or self.sent):
            return write(self, arg)
        sock, gather = self.sock, _Gather()
        self.sock = gather
        try:
            write(self, arg)
        finally:
            self.sock = sock
        sock.sendall(b"".join(gather.parts))

    whole_write.__wrapped__ = write  # type: ignore[attr-defined]
    return whole_write


def install() -> None:
    """Put the three in place in this process (the gunicorn arbiter, before it forks)."""
    global _installed
    if _installed:
        return
    from gunicorn import util
    from gunicorn.http import message, wsgi

    util.http_date = cached_http_date(util.http_date)
    message._ip_in_allow_list = cached_allow_list(message._ip_in_allow_list)
    wsgi.Response.write = one_write(wsgi.Response.write)
    _installed = True
