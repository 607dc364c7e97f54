"""Is a pooled, idle connection still usable? One non-blocking peek, no waiting.

Pools of kept-alive connections (the gateway's upstream HTTP client, proxy_app/http11.py, and its
Redis commands, redis_wire.py) must not send a request down a connection the server closed while
it sat idle (a restart, a keep-alive timeout). `select.select([sock], [], [], 0)` answers that, but
under gevent's monkey-patching `select` is emulated with a poll object and watchers per call;
py-spy --gil of the small-chat path had those readability checks at ~8% of the gateway worker's CPU
(redis-py runs one before every command). A MSG_PEEK|MSG_DONTWAIT recv on the OS socket answers the
same question in one syscall: EAGAIN → open and quiet; b"" → closed by the peer; bytes → data nobody
asked for (not reusable either).
"""

from __future__ import annotations

import select
import socket
from typing import Any


def idle_and_open(sock: Any) -> bool:
    """Whether `sock` (a stdlib or gevent socket, or None) is open with nothing unread."""
    if sock is None:
        return False
    raw = getattr(sock, "_sock", None)  # gevent's cooperative socket wraps the (non-blocking) OS socket
    try:
        if raw is not None:
            raw.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            return False
        # A stdlib socket with a timeout would wait in recv; select with 0 does not.
        readable, _, _ = select.select([sock], [], [], 0)
        return not readable
    except BlockingIOError:
        return True
    except (OSError, ValueError):
        return False
