"""One daemon thread per process that calls each registered job when it is due.

Stage bookkeeping that must run beside a stage — the lease heartbeat (lease.py) and the cancel
flag poll (cancel_watch.py) — would otherwise take a thread per stage, started and, at the
stage's end, woken to exit (three per session), and that wake-up (Event.set / Condition.notify)
alone is a visible share of a pool child's CPU (bench/bench_dispatch.py). A ticker polls its jobs
instead; a job that ends only leaves the set. A process forked while the thread runs starts its
own on its first job.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Protocol


class Job(Protocol):
    due: float  # next run (monotonic), kept by the ticker
    done: bool  # set by the owner when it no longer needs the job (skipped, then dropped)

    def tick(self) -> bool:
        """Do the periodic work; False drops the job. An exception keeps it (retried next time)."""
        ...


class Ticker:
    def __init__(self, name: str, poll: float = 0.5):
        self.name = name
        self._lock = threading.Lock()
        self._jobs: dict[int, tuple[Job, float]] = {}
        self._pid = 0
        self._thread: threading.Thread | None = None
        self._poll = poll

    def add(self, job: Job, period: float) -> None:
        """Run `job.tick()` every `period` seconds (the first time one period from now); the thread
        polls at least every period/2 so no job runs much later than due."""
        with self._lock:
            job.due = time.monotonic() + period
            self._jobs[id(job)] = (job, period)
            self._poll = min(self._poll, period / 2)
            if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
                self._thread.start()

    def remove(self, job: Job) -> None:
        with self._lock:
            self._jobs.pop(id(job), None)

    def _loop(self) -> None:
        while True:
            time.sleep(self._poll)
            with self._lock:
                jobs = list(self._jobs.values())
            for job, period in jobs:
                now = time.monotonic()
                if job.done or job.due > now:
                    continue
                job.due = now + period
                try:
                    keep = job.tick()
                except Exception:  # e.g. Redis unreachable: each owner has its own deadline for that
                    continue
                if not keep:
                    self.remove(job)
