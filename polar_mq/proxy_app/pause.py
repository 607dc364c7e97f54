"""The gateway's side of the weight-sync pause: admit each generation through Redis, hold it
while paused, stamp it with the policy version, and heart-beat so a drain can tell this process
is alive (see polar_mq/store/pause.py for why this leaves no window).

While paused a generation waits here — before anything goes upstream — for at most
`pause_max_hold` seconds, then fails with a retryable 503 rather than sample with weights that
may be half-updated. The wait is recorded on the call (`held_ms`, a note) and is not part of
`latency_ms`. The session's wall-clock budget (`timeout_seconds`) keeps running while a call
is held; `held_ms` makes that time visible per call and trajectories sum it (`held_seconds`).

Tests: tests/gateway/test_pause.py.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any, Callable

from polar_mq.model import CaptureRecord
from polar_mq.store.pause import ALIVE_TTL, HEARTBEAT_INTERVAL, PauseState
from polar_mq.store.core import StoreUnavailable
from polar_mq.proxy_app.adapters.base import GatewayError

if TYPE_CHECKING:
    from polar_mq.proxy_app.admission import Ticket

log = logging.getLogger("polar_mq.gateway.pause")

HOLD_POLL = 0.05


class PauseGate:
    def __init__(self, state: PauseState, *, max_hold: float, info: Callable[[], dict[str, Any]],
                 alive_ttl: float = ALIVE_TTL):
        self.state = state
        self.alive_ttl = alive_ttl  # this process's calls are lost once it beat none for this long
        self.max_hold = max_hold
        self.info = info
        self.gateway_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.observers: list[Callable[[int], None]] = []  # in-flight changes, for live metrics (metrics.py)

    def admit(self, record: CaptureRecord, ticket: "Ticket | None" = None) -> bool:
        """Wait until generation may start; stamps `policy_version` and `held_ms`. Returns whether
        the call was counted in flight (then `release` must follow). Redis down: the call goes
        on uncounted (the records are spooled; a pause cannot be enforced without Redis).
        `ticket`: the call's admission script already admitted it (admission.py): no round trip."""
        if ticket is not None and ticket.admitted:
            record.policy_version = ticket.version
            for observe in self.observers:
                observe(1)
            return True
        t0 = time.monotonic()
        while True:
            try:
                admitted, version = self.state.begin(self.gateway_id)
            except Exception as exc:  # redis errors: fail open
                if not _redis_error(exc):
                    raise
                record.notes.append("pause state unavailable (redis down): call not counted")
                return False
            held = time.monotonic() - t0
            if admitted:
                record.policy_version = version
                if held >= HOLD_POLL:
                    record.held_ms = round(held * 1000, 1)
                    record.notes.append(f"held {held:.1f} s by a weight-sync pause")
                for observe in self.observers:
                    observe(1)
                return True
            if held >= self.max_hold:
                record.held_ms = round(held * 1000, 1)
                raise GatewayError("upstream_unavailable", f"generation held {held:.0f} s by a weight-sync "
                                   "pause that has not ended; retry later")
            time.sleep(HOLD_POLL)

    def released(self, counted: bool) -> None:
        """The call's uncount went out with its record (admission.leave): tell the observers."""
        if counted:
            for observe in self.observers:
                observe(-1)

    def release(self, counted: bool) -> None:
        if not counted:
            return
        for observe in self.observers:
            observe(-1)
        try:
            self.state.end(self.gateway_id)
        except Exception as exc:
            if not _redis_error(exc):
                raise
            log.warning("could not uncount a finished call: %s", exc)

    # --- heartbeats -----------------------------------------------------------------------------
    def beat(self) -> None:
        try:
            self.state.heartbeat(self.gateway_id, self.info(), self.alive_ttl)
        except Exception as exc:
            if not _redis_error(exc):
                raise
            log.warning("gateway heartbeat failed: %s", exc)

    def start(self) -> None:
        self.beat()
        self._thread = threading.Thread(target=self._run, name="pause-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(HEARTBEAT_INTERVAL):
            self.beat()

    def stop(self) -> None:
        self._stop.set()
        try:
            self.state.forget(self.gateway_id)
        except Exception:
            pass


def _redis_error(exc: BaseException) -> bool:
    import redis

    return isinstance(exc, (StoreUnavailable, redis.ConnectionError, redis.TimeoutError))
