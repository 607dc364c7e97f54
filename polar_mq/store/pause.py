"""The cluster-wide weight-sync pause and the current policy version, shared in Redis by every
gateway process (which admits calls) and the rollout API (which pauses, drains and resumes).

Why it is safe: a gateway admits a generation with one atomic script that checks the pause flag
and, in the same step, counts the call as in flight for that gateway. The API's pause sets the
flag and then waits for the in-flight counts to reach 0. So once pause has returned drained, no
generation can start anywhere until resume: there is no cached flag and no window between
"checked" and "counted". A gateway that dies mid-call stops heart-beating; after HEARTBEAT_TTL
its counts no longer block the drain (they are reported and cleared as `dead_gateways`).

Tests: tests/gateway/test_pause.py, tests/store/test_redis_wire.py.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from polar_mq.store import replies
from polar_mq.store.wire import PipelineWire, Wire
from polar_mq.store.core import Keys

HEARTBEAT_INTERVAL = 1.0  # a gateway process beats this often
HEARTBEAT_TTL = 10.0  # no beat for this long: the gateway is dead, its in-flight calls do not count
# Each beat also sets the process's alive key (Keys.gateway_alive) for this long: once it expires
# the calls the process held are ended as `gateway_lost` (store/lost_calls.py). Five beats: a
# live process under load is not judged dead for one late beat.
ALIVE_TTL = 5.0

# KEYS: paused, inflight hash, version. ARGV: gateway id → {admitted 0|1, version or false}
_BEGIN = """
local v = redis.call('GET', KEYS[3])
if redis.call('EXISTS', KEYS[1]) == 1 then return {0, v} end
redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
return {1, v}
"""
# KEYS: inflight hash. ARGV: gateway id
_END = """
local n = redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
if n <= 0 then redis.call('HDEL', KEYS[1], ARGV[1]) end
return n
"""


@dataclass
class Drain:
    """How far a pause has drained: in-flight generations on live gateways, per gateway."""

    in_flight: int = 0
    gateways: dict[str, int] = field(default_factory=dict)
    live_gateways: list[str] = field(default_factory=list)
    dead_gateways: list[str] = field(default_factory=list)


def _version(raw: Any) -> int | None:
    if raw is None or raw is False:
        return None
    return int(raw)


VERSION_LOG = 64  # resumes remembered (a stream spans a handful at most)


def version_log_key(policy_version_key: str) -> str:
    return f"{policy_version_key}:log"


class PauseState:
    def __init__(self, client: redis.Redis, keys: Keys | None = None, wire: Wire | None = None):
        self.r = client
        self.keys = keys or Keys()
        self._begin = self.r.register_script(_BEGIN)
        self._end = self.r.register_script(_END)
        self.wire: Wire = wire if wire is not None else PipelineWire(client)  # the gateway's: its RedisWire

    # --- gateway side ---------------------------------------------------------------------------
    def begin(self, gateway_id: str) -> tuple[bool, int | None]:
        """Admit one generation unless paused. Returns (admitted, current policy version)."""
        k = self.keys
        admitted, version = self._begin(keys=[k.gateway_paused(), k.gateway_inflight_by_gateway(),
                                              k.policy_version()], args=[gateway_id])
        return bool(admitted), _version(version)

    def end(self, gateway_id: str) -> None:
        self._end(keys=[self.keys.gateway_inflight_by_gateway()], args=[gateway_id])

    def heartbeat(self, gateway_id: str, info: dict[str, Any], alive_ttl: float = ALIVE_TTL) -> None:
        for reply in self.wire.run([("ZADD", self.keys.gateway_heartbeats(), repr(time.time()), gateway_id),
                                    ("HSET", self.keys.gateway_info(), gateway_id, json.dumps(info)),
                                    ("SET", self.keys.gateway_alive(gateway_id), b"1",
                                     "PX", max(1, int(alive_ttl * 1000)))]):
            if isinstance(reply, redis.ResponseError):
                raise reply

    def forget(self, gateway_id: str) -> None:
        """A gateway shutting down cleanly (a call it still held is lost with it: no alive key)."""
        with self.r.pipeline(transaction=False) as pipe:
            pipe.delete(self.keys.gateway_alive(gateway_id))
            pipe.zrem(self.keys.gateway_heartbeats(), gateway_id)
            pipe.hdel(self.keys.gateway_info(), gateway_id)
            pipe.hdel(self.keys.gateway_inflight_by_gateway(), gateway_id)
            pipe.execute()

    # --- API side -------------------------------------------------------------------------------
    def pause(self, reason: str = "") -> None:
        self.r.set(self.keys.gateway_paused(), json.dumps({"since": time.time(), "reason": reason}), nx=True)

    def resume(self, policy_version: int | None = None, at: float | None = None) -> None:
        """Set the version first, in the same transaction: no call admitted by this resume can be
        stamped with the old version. `at`: when the resume began (before the engines were
        resumed: a frozen stream's next token may come before this transaction)."""
        with self.r.pipeline() as pipe:
            if policy_version is not None:
                pipe.set(self.keys.policy_version(), int(policy_version))
                # When each version took over: a stream that ran across this resume is split
                # at its first token after it (proxy_app/versions.py).
                log_key = version_log_key(self.keys.policy_version())
                pipe.rpush(log_key, json.dumps([int(policy_version), time.time() if at is None else at]))
                pipe.ltrim(log_key, -VERSION_LOG, -1)
            pipe.delete(self.keys.gateway_paused())
            pipe.execute()

    def versions_since(self, since: float) -> list[tuple[int, float]]:
        """(version, unix time it was set) of the resumes after `since`, oldest first."""
        out = []
        for raw in self.r.lrange(version_log_key(self.keys.policy_version()), 0, -1):
            try:
                version, at = json.loads(raw)
            except (ValueError, TypeError):
                continue
            if float(at) > since:
                out.append((int(version), float(at)))
        return out

    def paused_since(self) -> float | None:
        raw = self.r.get(self.keys.gateway_paused())
        if raw is None:
            return None
        try:
            value = json.loads(raw)
            return float(value["since"] if isinstance(value, dict) else value)
        except (ValueError, KeyError, TypeError):
            return time.time()

    def policy_version(self) -> int | None:
        return _version(self.r.get(self.keys.policy_version()))

    def gateways(self) -> dict[str, dict[str, Any]]:
        """Registered gateway processes: id → info + last_beat."""
        beats = dict(replies.scored(self.r.zrange(self.keys.gateway_heartbeats(), 0, -1, withscores=True)))
        infos = {k: json.loads(v) for k, v in replies.text_map(self.r.hgetall(self.keys.gateway_info())).items()}
        return {gid: {**infos.get(gid, {}), "last_beat": beat} for gid, beat in beats.items()}

    def drain(self, now: float | None = None, ttl: float = HEARTBEAT_TTL) -> Drain:
        now = now if now is not None else time.time()
        beats = dict(replies.scored(self.r.zrange(self.keys.gateway_heartbeats(), 0, -1, withscores=True)))
        counts = {k: int(v) for k, v in replies.text_map(self.r.hgetall(self.keys.gateway_inflight_by_gateway())).items()}
        out = Drain()
        for gid in sorted(set(beats) | set(counts)):
            alive = beats.get(gid, 0.0) >= now - ttl
            n = max(0, counts.get(gid, 0))
            if alive:
                out.live_gateways.append(gid)
                if n:
                    out.gateways[gid] = n
                    out.in_flight += n
            else:
                out.dead_gateways.append(gid)
        return out

    def clear_dead(self, dead: list[str]) -> None:
        if dead:
            with self.r.pipeline(transaction=False) as pipe:
                pipe.hdel(self.keys.gateway_inflight_by_gateway(), *dead)
                pipe.zrem(self.keys.gateway_heartbeats(), *dead)
                pipe.hdel(self.keys.gateway_info(), *dead)
                pipe.execute()
