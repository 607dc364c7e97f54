"""Is a pooled, idle connection still usable? One non-blocking peek, no waiting.

Pools of kept-alive connections (the gateway's upstream HTTP client, proxy_app/upstream/http11.py,
and its Redis commands, store/wire.py) must not send a request down a connection the server closed
while it sat idle (a restart, a keep-alive timeout). `select.select([sock], [], [], 0)` answers
that, but under gevent's monkey-patching `select` is emulated with a poll object and watchers per
call, a noticeable share of a small call's CPU (redis-py runs one before every command). A
MSG_PEEK|MSG_DONTWAIT recv on the OS socket answers the same question in one syscall: EAGAIN →
open and quiet; b"" → closed by the peer; bytes → data nobody asked for (not reusable either;
tests/gateway/test_idle_socket.py).
"""

from __future__ import annotations

import select
import socket
from typing import Any


# A plain int: `|` on the socket module's IntFlag members builds a new enum member through
# enum.py on every call, and this runs before every pooled request.

_PEEK_NOW = int(socket.MSG_PEEK | socket.MSG_DONTWAIT)


def _peek(sock: Any) -> bytes | None:
    """One byte of what `sock` holds unread (b"": the peer closed it), or None when nothing has
    arrived; never waits. OSError when the socket is broken."""
    raw = getattr(sock, "_sock", None)  # gevent's cooperative socket wraps the (non-blocking) OS socket
    if raw is None:
        # A stdlib socket with a timeout polls before it receives (it would wait); poll with 0
        # does not. Not select.select: it refuses descriptors >= 1024 (FD_SETSIZE), and a gateway
        # holding a thousand streams has thousands of sockets.
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        if not poller.poll(0):
            return None
        raw = sock
    try:
        return raw.recv(1, _PEEK_NOW)
    except BlockingIOError:
        return None


def idle_and_open(sock: Any) -> bool:
    """Whether `sock` (a stdlib or gevent socket, or None) is open with nothing unread."""
    if sock is None:
        return False
    try:
        return _peek(sock) is None
    except (OSError, ValueError):
        return False


def peer_closed(sock: Any) -> bool:
    """Whether the peer closed `sock` (readable, and nothing to read); data waiting (a pipelined
    request) is not a close. A broken socket counts as closed."""
    if sock is None:
        return False
    try:
        return _peek(sock) == b""
    except (OSError, ValueError):
        return True


def has_data(sock: Any) -> bool:
    """Whether a read of `sock` would return at once (bytes or the peer's close); a broken
    socket counts (its read reports it)."""
    try:
        return _peek(sock) is not None
    except (OSError, ValueError):
        return True
