"""A task's cancel flag, watched off the harness supervisor's loop.

The run stage's supervisor asks `should_stop()` every 0.2 s; the lease self-fence must be able to
stop the harness then, within 0.6 × TTL of the last renewal. A cancel check that reads Redis there
blocks that loop for as long as Redis is unreachable (the client rides out outages), so a host cut
off from Redis kept its harness running for the whole partition. The flag is read here, by a
thread, and `should_stop` only looks at two in-memory events.

Tests: tests/pipeline/test_cancel.py.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Hashable

from polar_mq.tasks.worker.ticker import Ticker


# One thread per process polls every live CancelWatch (ticker.py says why not one per stage).
_POLLER = Ticker("polar-cancel-watch")

# Watches of one flag (the sessions of one task in this process) share a read made within
# SHARED_FRESH seconds — one ticker pass — so a process holding hundreds of a task's sessions reads
# its flag once per pass, not once per session (bench/bench_soak.py: EXISTS was the most frequent
# Redis command per session). Only the poller thread reads or writes _SHARED.
# tests/pipeline/test_cancel_watch.py guards it.
SHARED_FRESH = 0.1
_SHARED: dict[Hashable, tuple[float, bool]] = {}


class CancelWatch:
    def __init__(self, is_cancelled: Callable[[], bool], interval: float = 0.5, key: Hashable | None = None):
        self.cancelled = threading.Event()
        self.check = is_cancelled
        self.interval = interval
        self.key = key  # watches with the same key read the same flag
        self.due = 0.0
        self.done = False

    def _read(self) -> bool:
        if self.key is None:
            return self.check()
        now = time.monotonic()
        hit = _SHARED.get(self.key)
        if hit is not None and now - hit[0] < SHARED_FRESH:
            return hit[1]
        value = self.check()
        if len(_SHARED) > 1024:
            for k in [k for k, (t, _) in _SHARED.items() if now - t > 1.0]:
                del _SHARED[k]
        _SHARED[self.key] = (now, value)
        return value

    def tick(self) -> bool:
        """The poller's call: read the flag; once it is set, the watch is done. A failed read
        (Redis unreachable) is retried: the lease self-fence covers that case."""
        if self._read():
            self.cancelled.set()
            return False
        return True

    def __enter__(self) -> "CancelWatch":
        _POLLER.add(self, self.interval)
        return self

    def __exit__(self, *exc) -> None:
        self.done = True
        _POLLER.remove(self)
