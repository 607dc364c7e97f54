"""A session lease with a heartbeat: the proof that a live worker owns a session's stage.

Broker redelivery alone cannot tell a slow worker from a dead one (agent sessions outlive any
sensible visibility timeout). A lease renewed every ttl/3 can: when it lapses the janitor hands
the stage to another worker; while it lives, duplicates step aside.

Fencing: the holder counts its lease as lost once it has gone `SELF_FENCE × ttl` without a
successful renewal (Redis unreachable, the host cut off, the process paused), i.e. *before* the
lease can lapse in Redis, so it stops its harness before anyone else may start the stage again.
Its token also fences every write (PipelineStore.transition(fence=...)): after the lapse no write
of this attempt is accepted, whatever the worker believes.

Tests: tests/pipeline/test_fencing_recovery.py.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from contextlib import contextmanager
from typing import Iterator

from polar_mq.store.pipeline import PipelineStore, node_name
from polar_mq.tasks.worker.ticker import Ticker

SELF_FENCE = 0.6  # of the TTL; the harness kill (≤ 2.5 s) must fit into the remaining 40 %


class LeaseBusy(Exception):
    """Another live worker holds the session."""


class LeaseLost(threading.Event):
    """Set when the lease is gone; `is_set` also turns true once renewals failed for too long."""

    def __init__(self, ttl: float):
        super().__init__()
        self.ttl = ttl
        self.last_ok = time.monotonic()

    def is_set(self) -> bool:  # type: ignore[override]
        if not super().is_set() and time.monotonic() - self.last_ok > SELF_FENCE * self.ttl:
            self.set()
        return super().is_set()


# One heartbeat thread per process for every lease it holds (ticker.py says why not one per lease).
# Each lease is renewed ttl/6 after its last renewal, as a per-lease thread did. Self-fencing does
# not depend on this thread: LeaseLost turns true by the clock once renewals stop succeeding.
_KEEPER = Ticker("polar-lease-keeper")


class Lease:
    def __init__(self, store: PipelineStore, session_id: str, ttl: float, node: str | None = None):
        self.store = store
        self.session_id = session_id
        self.ttl = ttl
        # `<node>:<pid>:<random>`: the node names the host that holds it (host_loss.lease_node)
        self.token = f"{node}:{os.getpid()}" if node else node_name()
        self.token += f":{uuid.uuid4().hex[:8]}"
        self.lost = LeaseLost(ttl)
        self.task_cancelled = False  # the task's cancel flag when the lease was taken (enter_stage)
        self.due = 0.0  # next renewal (monotonic), kept by the process's keeper (_KEEPER)
        self.done = False
        self._released = False

    def __enter__(self) -> "Lease":
        if not self.store.acquire_lease(self.session_id, self.token, self.ttl):
            raise LeaseBusy(f"session {self.session_id} is held by {self.store.lease_holder(self.session_id)}")
        self._start_beat()
        return self

    @contextmanager
    def held(self) -> Iterator["Lease"]:
        """Hold a lease already taken for `self.token` (PipelineStore.enter_stage takes it in the
        stage's first round trip): heartbeat while inside, released on exit."""
        self._start_beat()
        try:
            yield self
        finally:
            self.__exit__(None, None, None)

    def _start_beat(self) -> None:
        self.lost.last_ok = time.monotonic()
        _KEEPER.add(self, self.ttl / 6)

    def _stop(self) -> None:
        self.done = True
        _KEEPER.remove(self)

    def tick(self) -> bool:
        """The keeper's call: renew, unless the lease is already lost (then drop it)."""
        if self.lost.is_set():
            return False
        try:
            self._renew_once()
        except Exception:  # Redis blip: keep trying; LeaseLost turns true on its own in time
            pass
        return True

    def _renew_once(self) -> None:
        started = time.monotonic()
        if self.store.renew_lease(self.session_id, self.token, self.ttl):
            # Count from when the renewal was sent: the lease runs from (at latest) then.
            self.lost.last_ok = max(self.lost.last_ok, started)
        else:
            self.lost.set()

    def renew(self) -> None:
        """Explicit renewal from a busy loop (the keeper thread also renews)."""
        try:
            self._renew_once()
        except Exception:
            pass

    def released(self) -> None:
        """The stage's last write dropped the lease with it (FencedStore, release=True): stop
        renewing, and nothing is left to release on exit."""
        self._released = True
        self._stop()

    def __exit__(self, *exc) -> None:
        self._stop()
        if self._released:
            return
        try:
            self.store.release_lease(self.session_id, self.token)
        except Exception:
            pass
