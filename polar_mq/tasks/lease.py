"""A session lease with a heartbeat: the proof that a live worker owns a session's stage.

Broker redelivery alone cannot tell a slow worker from a dead one (agent sessions outlive any
sensible visibility timeout). A lease renewed every ttl/3 can: when it lapses the janitor hands
the stage to another worker; while it lives, duplicates step aside.
"""

from __future__ import annotations

import threading
import uuid

from ..pipeline_store import PipelineStore, node_name


class LeaseBusy(Exception):
    """Another live worker holds the session."""


class Lease:
    def __init__(self, store: PipelineStore, session_id: str, ttl: float):
        self.store = store
        self.session_id = session_id
        self.ttl = ttl
        self.token = f"{node_name()}:{uuid.uuid4().hex[:8]}"
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "Lease":
        if not self.store.acquire_lease(self.session_id, self.token, self.ttl):
            raise LeaseBusy(f"session {self.session_id} is held by {self.store.lease_holder(self.session_id)}")
        self._thread = threading.Thread(target=self._beat, name=f"lease-{self.session_id}", daemon=True)
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                if not self.store.renew_lease(self.session_id, self.token, self.ttl):
                    self.lost.set()
                    return
            except Exception:  # Redis blip: keep trying until the lease would lapse
                continue

    def renew(self) -> None:
        """Explicit renewal from a busy loop (the heartbeat thread also renews)."""
        if not self.store.renew_lease(self.session_id, self.token, self.ttl):
            self.lost.set()

    def __exit__(self, *exc) -> None:
        self._stop.set()
        try:
            self.store.release_lease(self.session_id, self.token)
        except Exception:
            pass
