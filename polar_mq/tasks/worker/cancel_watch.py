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
from typing import Callable

from polar_mq.tasks.worker.ticker import Ticker


# One thread per process polls every live CancelWatch (ticker.py says why not one per stage).
_POLLER = Ticker("polar-cancel-watch")


class CancelWatch:
    def __init__(self, is_cancelled: Callable[[], bool], interval: float = 0.5):
        self.cancelled = threading.Event()
        self.check = is_cancelled
        self.interval = interval
        self.due = 0.0
        self.done = False

    def tick(self) -> bool:
        """The poller's call: read the flag; once it is set, the watch is done. A failed read
        (Redis unreachable) is retried: the lease self-fence covers that case."""
        if self.check():
            self.cancelled.set()
            return False
        return True

    def __enter__(self) -> "CancelWatch":
        _POLLER.add(self, self.interval)
        return self

    def __exit__(self, *exc) -> None:
        self.done = True
        _POLLER.remove(self)
