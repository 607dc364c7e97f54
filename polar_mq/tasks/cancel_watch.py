"""A task's cancel flag, watched off the harness supervisor's loop.

The run stage's supervisor asks `should_stop()` every 0.2 s; the lease self-fence must be able to
stop the harness then, within 0.6 × TTL of the last renewal. A cancel check that reads Redis there
blocks that loop for as long as Redis is unreachable (the client rides out outages), so a host cut
off from Redis kept its harness running for the whole partition. The flag is read here, by a
thread, and `should_stop` only looks at two in-memory events.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable


class _Poller:
    """One thread per process polls every live CancelWatch. A thread per run stage was started
    and, at the stage's end, woken to exit; py-spy (--gil, bench_dispatch) showed that wake-up
    (Event.set / Condition.notify) as a tenth of a run pool child's samples together with the
    lease heartbeat's (lease.py _Keeper). A watch that ends only leaves the set."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watches: dict[int, "CancelWatch"] = {}
        self._pid = 0
        self._thread: threading.Thread | None = None
        self._tick = 0.5

    def add(self, watch: "CancelWatch") -> None:
        with self._lock:
            watch.due = time.monotonic() + watch.interval
            self._watches[id(watch)] = watch
            self._tick = min(self._tick, watch.interval)
            if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._loop, name="polar-cancel-watch", daemon=True)
                self._thread.start()

    def remove(self, watch: "CancelWatch") -> None:
        with self._lock:
            self._watches.pop(id(watch), None)

    def _loop(self) -> None:
        while True:
            time.sleep(self._tick)
            with self._lock:
                watches = list(self._watches.values())
            for watch in watches:
                now = time.monotonic()
                if watch.done or watch.due > now:
                    continue
                watch.due = now + watch.interval
                try:
                    if watch.check():
                        watch.cancelled.set()
                        self.remove(watch)
                except Exception:  # Redis unreachable: the lease self-fence covers this case
                    continue


_POLLER = _Poller()


class CancelWatch:
    def __init__(self, is_cancelled: Callable[[], bool], interval: float = 0.5):
        self.cancelled = threading.Event()
        self.check = is_cancelled
        self.interval = interval
        self.due = 0.0
        self.done = False

    def __enter__(self) -> "CancelWatch":
        _POLLER.add(self)
        return self

    def __exit__(self, *exc) -> None:
        self.done = True
        _POLLER.remove(self)
