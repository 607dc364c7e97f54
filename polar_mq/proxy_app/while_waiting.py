"""Work a call queues to run while it waits for its upstream.

A generation spends most of its time waiting for the upstream's answer, and the gateway knows a
good part of the call's record before that answer comes: the request side of its encoding
(record_codec.Encoder.prepare). Done after the answer, that work sits between the answer and
the client's reply; queued here, it runs in the wait instead.

Under the gevent worker a callback queued on the event loop runs the next time the loop turns:
when the calling greenlet blocks on the upstream's socket. A callback the loop has not run when
the caller needs its result is cancelled, and the caller does the work itself (`Queued.ran`
says which). Without gevent (the gthread worker, the dev server, tests in threads) nothing is
queued: there is no wait to fill on a thread of its own, and the caller does the work after, as
before.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

log = logging.getLogger("polar_mq.while_waiting")


class Queued:
    """One function queued on the event loop (or not queued at all: `ran` stays False)."""

    __slots__ = ("_fn", "_callback", "ran")

    def __init__(self, fn: Callable[[], None]):
        self._fn: Callable[[], None] | None = fn
        self._callback: Any = None
        self.ran = False

    def _run(self) -> None:
        fn, self._fn, self._callback = self._fn, None, None
        if fn is None:
            return
        try:
            fn()
            self.ran = True
        except Exception:  # the caller does the work itself, and meets the error there
            log.debug("work queued for the upstream wait failed", exc_info=True)

    def cancel(self) -> bool:
        """Stop a run that has not happened; returns `ran`."""
        callback, self._callback, self._fn = self._callback, None, None
        if callback is not None:
            callback.stop()
        return self.ran


_get_hub: Any = None  # gevent.get_hub once this process is known to run patched; False: it is not


def _loop() -> Any:
    """The gevent hub's loop when this process runs under gevent's patching, else None (decided
    on first use: the gevent worker patches before it serves)."""
    global _get_hub
    if _get_hub is None:
        try:
            from gevent import get_hub, monkey
        except ImportError:
            _get_hub = False
        else:
            _get_hub = get_hub if monkey.is_module_patched("socket") else False
    return _get_hub().loop if _get_hub else None


def queue(fn: Callable[[], None]) -> Queued:
    """Queue `fn` to run while the caller waits (see the module docstring)."""
    queued = Queued(fn)
    loop = _loop()
    if loop is not None:
        queued._callback = loop.run_callback(queued._run)
    return queued
