"""Two Redis round trips per generation: one script to let it in, one transaction to let it out.

A call used to cost six (key GET, in-flight HSET, cancel EXISTS, pause script, pause uncount
script, record MULTI, in-flight HDEL); on a loaded host each is a scheduler wake-up of redis-server
and of the gateway, and together they took more wall time than the upstream call (py-spy of the
small-chat path, bench/bench_gateway.py). Now:

- `enter` runs one script that (a) checks that a session key resolved from this process's cache
  still names the session (a session collected by retention answers 401 as before), (b) refuses a
  cancelled session, (c) registers the call in the session's in-flight hash (postrun waits on it),
  and (d) does the pause admission of pause_state.py in the same atomic step: not paused → counted
  in flight for this gateway and stamped with the policy version. A paused call is registered but
  not counted; the pause gate then holds it as before (pause.py).
- `leave` adds to the record's own MULTI (store.append_call) the in-flight HDEL and, when the call
  was counted, the pause uncount: the record is stored, the call leaves the session's in-flight
  set and the drain count in one atomic step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..redis_wire import RedisWire
from ..store import Keys

# KEYS: key mapping, cancelled flag, session in-flight hash, paused flag, in-flight by gateway,
#       policy version. ARGV: session id, call id, now, gateway id, check key (0|1)
_ENTER = """
if ARGV[5] == '1' and redis.call('GET', KEYS[1]) ~= ARGV[1] then return {-1, false, false} end
if redis.call('EXISTS', KEYS[2]) == 1 then return {0, false, false} end
redis.call('HSET', KEYS[3], ARGV[2], ARGV[3])
redis.call('EXPIRE', KEYS[3], 86400)
local v = redis.call('GET', KEYS[6])
if redis.call('EXISTS', KEYS[4]) == 1 then return {1, 0, v} end
redis.call('HINCRBY', KEYS[5], ARGV[4], 1)
return {1, 1, v}
"""
# the uncount of pause_state._END, sent as EVAL inside the record's MULTI (no extra round trip)
_LEAVE = """
local n = redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
if n <= 0 then redis.call('HDEL', KEYS[1], ARGV[1]) end
return n
"""

UNKNOWN_KEY, CANCELLED, REGISTERED = -1, 0, 1


@dataclass
class Ticket:
    """What `enter` decided: `state` (UNKNOWN_KEY, CANCELLED or REGISTERED), whether the call was
    admitted past the pause (counted in flight) and the policy version it was admitted under."""

    state: int
    admitted: bool = False
    version: int | None = None


class Admission:
    def __init__(self, client: Any, keys: Keys, gateway_id: str):
        self.r = client
        self.keys = keys
        self.gateway_id = gateway_id
        self._enter = client.register_script(_ENTER)
        self.wire: RedisWire | None = None  # set by the gateway (redis_wire.py)

    def enter(self, session_id: str, call_id: str, now: float, key: str | None = None) -> Ticket:
        """One round trip; `key`: a session key resolved from the cache, checked again here.
        Redis errors propagate (the caller falls back to the uncounted path)."""
        k = self.keys
        keys = [k.gateway_key(key or ""), k.session_cancelled(session_id), k.session_inflight(session_id),
                k.gateway_paused(), k.gateway_inflight_by_gateway(), k.policy_version()]
        args = [session_id, call_id, repr(now), self.gateway_id, "1" if key else "0"]
        if self.wire is not None:
            state, admitted, version = self.wire.evalsha(self._enter.sha, _ENTER, keys, args)
        else:
            state, admitted, version = self._enter(keys=keys, args=args)
        return Ticket(int(state), bool(admitted), None if version in (None, False) else int(version))

    def leave(self, pipe: Any, session_id: str, call_id: str, counted: bool) -> None:
        """Queue the call's exit on the record's MULTI pipeline."""
        pipe.hdel(self.keys.session_inflight(session_id), call_id)
        if counted:
            pipe.eval(_LEAVE, 1, self.keys.gateway_inflight_by_gateway(), self.gateway_id)
