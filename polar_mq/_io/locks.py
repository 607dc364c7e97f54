"""Locks that stay cheap in the gateway's gevent worker.

gevent's monkey-patching replaces `threading.Lock` with its own lock, written in Python
(`gevent.thread.LockType`): acquire, release and even creating one run several Python frames.
The gateway takes a dozen short locks per call (connection lists, caches, the in-flight
registry), so that Python lock shows up in a small call's CPU profile.

`short_lock()` is the C lock (the unpatched `_thread.allocate_lock`) for critical
sections that only touch Python data: no I/O, no sleep, nothing that can switch greenlets. Under
gevent a greenlet therefore never holds it across a switch, so no other greenlet ever finds it
taken and blocks the thread; under threads it is the ordinary lock. A section that can block
(a socket, a wait) must keep `threading.Lock`.
"""

from __future__ import annotations

import threading
from typing import Any, Callable


def _original_allocate_lock() -> Callable[[], Any]:
    try:
        from gevent import monkey
    except ImportError:
        return threading.Lock
    return monkey.get_original("_thread", "allocate_lock")


_allocate = _original_allocate_lock()


def short_lock() -> Any:
    """A C lock for a critical section that cannot switch greenlets (module docstring)."""
    return _allocate()


def bounded_semaphore(n: int) -> Any:
    """gevent's own (compiled) semaphore in a monkey-patched process, else threading's. The stdlib
    one is Python code over a Condition: under gevent its release alone runs notify, _is_owned
    and two lock round trips."""
    try:
        from gevent import monkey
    except ImportError:
        return threading.BoundedSemaphore(n)
    if not monkey.is_module_patched("threading"):
        return threading.BoundedSemaphore(n)
    from gevent.lock import BoundedSemaphore
    return BoundedSemaphore(n)
