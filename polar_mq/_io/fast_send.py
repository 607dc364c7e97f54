"""`send_all`: a socket's `sendall`, in one `send` when the kernel takes the whole buffer.

Why: gevent's cooperative `sendall` reads the socket's SO_SNDBUF (a getsockopt system call), the
clock and a memoryview slice before its first send, on every call; for the gateway's replies and
upstream requests, which almost always fit the send buffer whole, that is pure overhead. `send`
tries the OS socket first and waits (cooperatively, with the

socket's timeout) only when the buffer is full, as `sendall` does; whatever it did not take goes
through `sendall`. Errors are the socket's own, as from `sendall`.
"""

from __future__ import annotations

from typing import Any


def send_all(sock: Any, data: bytes) -> None:
    """`sock.sendall(data)` (a stdlib or gevent socket)."""
    if not data:
        return
    sent = sock.send(data)
    if sent < len(data):
        sock.sendall(memoryview(data)[sent:])
