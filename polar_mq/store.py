"""Redis layout and msgpack encoding: the one place that knows key names.

Gateway sessions, their keys and their capture records live here; later stages (API, workers)
add their own keys to `Keys` rather than spelling key strings elsewhere.
"""

from __future__ import annotations

import secrets
from typing import Any, Iterable

import msgpack
import redis

from .model import CaptureRecord, GatewaySession, Trajectory


class Keys:
    """Every Redis key polar_mq uses, under one prefix."""

    def __init__(self, prefix: str = "pmq"):
        self.prefix = prefix

    def gateway_key(self, key: str) -> str:
        return f"{self.prefix}:gw:key:{key}"

    def gateway_session(self, session_id: str) -> str:
        return f"{self.prefix}:gw:session:{session_id}"

    def calls(self, session_id: str) -> str:
        return f"{self.prefix}:gw:calls:{session_id}"

    def trajectory(self, session_id: str, builder: str) -> str:
        return f"{self.prefix}:traj:{session_id}:{builder}"

    def gateway_paused(self) -> str:
        return f"{self.prefix}:gw:paused"

    def gateway_inflight(self) -> str:
        return f"{self.prefix}:gw:inflight"

    def token_text(self, model: str) -> str:
        """Hash: token id → its text for one served model (viewers show every recorded id)."""
        return f"{self.prefix}:gw:toktext:{model}"

    # --- rollout pipeline -----------------------------------------------------------------------
    def task(self, task_id: str) -> str:
        return f"{self.prefix}:task:{task_id}"

    def task_sessions(self, task_id: str) -> str:
        return f"{self.prefix}:task:{task_id}:sessions"

    def task_cancelled(self, task_id: str) -> str:
        return f"{self.prefix}:task:{task_id}:cancelled"

    def task_index(self) -> str:
        return f"{self.prefix}:tasks"

    def session(self, session_id: str) -> str:
        return f"{self.prefix}:session:{session_id}"

    def lease(self, session_id: str) -> str:
        return f"{self.prefix}:lease:{session_id}"

    def active_sessions(self) -> str:
        """Sessions that are not terminal: the janitor scans these for dead leases."""
        return f"{self.prefix}:sessions:active"

    def ready(self) -> str:
        return f"{self.prefix}:ready"

    def ready_slots(self) -> str:
        return f"{self.prefix}:ready:slots"

    def ready_wakeup(self) -> str:
        return f"{self.prefix}:ready:wakeup"

    def janitor_lock(self) -> str:
        return f"{self.prefix}:janitor"

    def ready_capacity(self) -> str:
        return f"{self.prefix}:ready:capacity"

    def callbacks_done(self, task_id: str) -> str:
        return f"{self.prefix}:task:{task_id}:callback"

    def counter(self) -> str:
        return f"{self.prefix}:metrics"

    # --- groups for trainers (group_queue.py) ----------------------------------------------------
    def task_terminal(self, task_id: str) -> str:
        """Sessions of a task that reached a terminal state (the group is done when all are)."""
        return f"{self.prefix}:task:{task_id}:terminal"

    def group(self, task_id: str) -> str:
        """Hash: finished_at, delivery, leased_until, acked_at, ack_reason."""
        return f"{self.prefix}:group:{task_id}"

    def group_prefix(self) -> str:
        return f"{self.prefix}:group:"

    def groups_pending(self) -> str:
        """ZSET task_id → finished_at: finished groups ready to hand out, oldest first."""
        return f"{self.prefix}:groups:pending"

    def groups_leased(self) -> str:
        """ZSET task_id → lease expiry: groups handed out and not acked yet."""
        return f"{self.prefix}:groups:leased"

    def groups_wakeup(self) -> str:
        return f"{self.prefix}:groups:wakeup"

    # --- weight versions and the cluster-wide pause (proxy_app/pause.py, api/admin.py) ------------
    def policy_version(self) -> str:
        return f"{self.prefix}:gw:policy_version"

    def gateway_inflight_by_gateway(self) -> str:
        """Hash gateway id → generations in flight there (the admin pause drains the live ones)."""
        return f"{self.prefix}:gw:inflight:by_gateway"

    def gateway_heartbeats(self) -> str:
        """ZSET gateway id → last heartbeat (unix time)."""
        return f"{self.prefix}:gw:heartbeats"

    def gateway_info(self) -> str:
        """Hash gateway id → JSON {upstreams, host, pid, started_at}."""
        return f"{self.prefix}:gw:gateways"

    def upstream_weights(self) -> str:
        """Hash upstream URL → JSON of what its RL API last reported (weight version, paused)."""
        return f"{self.prefix}:gw:upstream_weights"

    def histogram(self, name: str) -> str:
        """Hash of one Prometheus histogram observed by many processes (histograms.py)."""
        return f"{self.prefix}:hist:{name}"


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def unpack(blob: bytes) -> Any:
    return msgpack.unpackb(blob, raw=False, strict_map_key=False)


class StoreUnavailable(Exception):
    """Redis could not be reached; callers turn this into a 503, never a silent loss."""


def _guard(fn):
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise StoreUnavailable(f"redis unavailable: {exc}") from exc

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


def connect(url: str, *, ride_out_outages: float = 0.0) -> redis.Redis:
    """A Redis client. The gateway uses short timeouts (it must answer 503 quickly when Redis is
    down); workers pass `ride_out_outages` seconds to retry through a Redis restart instead."""
    if ride_out_outages <= 0:
        return redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=5,
                                    health_check_interval=30)
    from redis.backoff import ExponentialBackoff
    from redis.retry import Retry

    retries = max(1, int(ride_out_outages / 1.0))
    return redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=10, health_check_interval=10,
                                retry=Retry(ExponentialBackoff(cap=1.0, base=0.1), retries),
                                retry_on_error=[redis.ConnectionError, redis.TimeoutError])


class GatewayStore:
    """Sessions, session keys and capture records."""

    def __init__(self, client: redis.Redis, keys: Keys | None = None):
        self.r = client
        self.keys = keys or Keys()

    @_guard
    def ping(self) -> bool:
        return bool(self.r.ping())

    @_guard
    def create_session(self, session_id: str, task_id: str | None = None,
                       metadata: dict[str, Any] | None = None) -> tuple[GatewaySession, bool]:
        """Create a session (or return the existing one with that id). Returns (session, created)."""
        existing = self.get_session(session_id)
        if existing is not None:
            return existing, False
        session = GatewaySession(session_id=session_id, key="pmq-" + secrets.token_urlsafe(24),
                                 task_id=task_id, metadata=metadata or {})
        pipe = self.r.pipeline()
        # NX on the session record makes concurrent creations of one id agree on a single key.
        pipe.set(self.keys.gateway_session(session_id), pack(session.to_dict()), nx=True)
        result = pipe.execute()
        if not result[0]:
            return self.get_session(session_id), False  # type: ignore[return-value]
        self.r.set(self.keys.gateway_key(session.key), session_id)
        return session, True

    @_guard
    def get_session(self, session_id: str) -> GatewaySession | None:
        blob = self.r.get(self.keys.gateway_session(session_id))
        return GatewaySession.from_dict(unpack(blob)) if blob else None

    @_guard
    def resolve_key(self, key: str) -> str | None:
        """Session id for a session key, or None for an unknown key."""
        sid = self.r.get(self.keys.gateway_key(key))
        return sid.decode() if sid else None

    @_guard
    def append_call(self, record: CaptureRecord) -> None:
        self.r.rpush(self.keys.calls(record.session_id), pack(record.to_dict()))

    @_guard
    def calls(self, session_id: str) -> list[CaptureRecord]:
        blobs = self.r.lrange(self.keys.calls(session_id), 0, -1)
        records = [CaptureRecord.from_dict(unpack(b)) for b in blobs]
        records.sort(key=lambda rec: rec.started_at)
        return records

    @_guard
    def append_calls(self, records: Iterable[CaptureRecord]) -> int:
        n = 0
        pipe = self.r.pipeline()
        for rec in records:
            pipe.rpush(self.keys.calls(rec.session_id), pack(rec.to_dict()))
            n += 1
        pipe.execute()
        return n

    @_guard
    def save_trajectory(self, trajectory: Trajectory) -> None:
        self.r.set(self.keys.trajectory(trajectory.session_id, trajectory.builder),
                   pack(trajectory.to_dict()))

    @_guard
    def paused(self) -> bool:
        return bool(self.r.exists(self.keys.gateway_paused()))

    @_guard
    def inflight_add(self, delta: int) -> None:
        """Generations in flight across all gateways (the admin pause drains this to 0)."""
        self.r.incrby(self.keys.gateway_inflight(), delta)
