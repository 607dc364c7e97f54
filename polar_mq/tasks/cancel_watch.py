"""A task's cancel flag, watched off the harness supervisor's loop.

The run stage's supervisor asks `should_stop()` every 0.2 s; the lease self-fence must be able to
stop the harness then, within 0.6 × TTL of the last renewal. A cancel check that reads Redis there
blocks that loop for as long as Redis is unreachable (the client rides out outages), so a host cut
off from Redis kept its harness running for the whole partition. The flag is read here, by a
thread, and `should_stop` only looks at two in-memory events.
"""

from __future__ import annotations

import threading
from typing import Callable


class CancelWatch:
    def __init__(self, is_cancelled: Callable[[], bool], interval: float = 0.5):
        self.cancelled = threading.Event()
        self._done = threading.Event()
        self._check = is_cancelled
        self._interval = interval
        self._thread = threading.Thread(target=self._loop, name="polar-cancel-watch", daemon=True)

    def __enter__(self) -> "CancelWatch":
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._done.wait(self._interval):
            try:
                if self._check():
                    self.cancelled.set()
                    return
            except Exception:  # Redis unreachable: the lease self-fence covers this case
                continue

    def __exit__(self, *exc) -> None:
        self._done.set()
