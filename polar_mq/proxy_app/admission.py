"""Two Redis round trips per generation: one script to let it in, one transaction to let it out.

Why two: each step done on its own (key GET, in-flight HSET, cancel EXISTS, pause script, pause
uncount script, record MULTI, in-flight HDEL) would be a round trip, and on a loaded host each is
a scheduler wake-up of redis-server and of the gateway; six of them take more wall time than a
small upstream call. So (tests/gateway/test_early_admission.py, tests/gateway/test_pause.py):

- `enter` runs one script that (a) checks that a session key resolved from this process's cache
  still names the session (a session collected by retention answers 401), (b) refuses a
  cancelled session, (c) registers the call in the session's in-flight hash (postrun waits on it),
  and (d) does the pause admission of store/pause.py in the same atomic step: not paused → counted
  in flight for this gateway and stamped with the policy version. A paused call is registered but
  not counted; the pause gate then holds it (pause.py).
- `send_enter` sends that script as soon as the request's head names the session, before the body
  is read and converted (fastpath.py), and `Entry.ticket` reads its answer where the call needs
  it: the Redis round trip runs while the gateway parses and converts the body, instead of after.
  A call that fails before it starts (a malformed body, a refused conversion) withdraws its entry
  (`Entry.withdraw`: out of the session's in-flight hash and the drain count again).
- `leave` adds to the record's own MULTI (store.append_call) the in-flight HDEL and, when the call
  was counted, the pause uncount: the record is stored, the call leaves the session's in-flight
  set and the drain count in one atomic step.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from redis.exceptions import NoScriptError, ResponseError

from polar_mq.store.wire import PipelineWire, Replies, Wire
from polar_mq.store.core import Keys
from polar_mq.store.lost_calls import entry_value

# KEYS: key mapping, cancelled flag, session in-flight hash, paused flag, in-flight by gateway,
#       policy version. ARGV: session id, call id, the in-flight entry (`<now>|<gateway id>|
#       <provider>`: whose death ends the call, store/lost_calls.py), gateway id, check key (0|1)
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
# the uncount of store/pause.py _END, sent as EVAL inside the record's MULTI (no extra round trip)
_LEAVE = """
local n = redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
if n <= 0 then redis.call('HDEL', KEYS[1], ARGV[1]) end
return n
"""

UNKNOWN_KEY, CANCELLED, REGISTERED = -1, 0, 1

log = logging.getLogger("polar_mq.gateway")


@dataclass
class Ticket:
    """What `enter` decided: `state` (UNKNOWN_KEY, CANCELLED or REGISTERED), whether the call was
    admitted past the pause (counted in flight) and the policy version it was admitted under."""

    state: int
    admitted: bool = False
    version: int | None = None


class Admission:
    def __init__(self, client: Any, keys: Keys, gateway_id: str, wire: Wire | None = None):
        self.r = client
        self.keys = keys
        self.gateway_id = gateway_id
        self._enter = client.register_script(_ENTER)
        self.wire: Wire = wire if wire is not None else PipelineWire(client)

    def _command(self, session_id: str, call_id: str, now: float, key: str | None,
                 provider: str | None = None) -> tuple[list[str], list[str]]:
        k = self.keys
        keys = [k.gateway_key(key or ""), k.session_cancelled(session_id), k.session_inflight(session_id),
                k.gateway_paused(), k.gateway_inflight_by_gateway(), k.policy_version()]
        return keys, [session_id, call_id, entry_value(now, self.gateway_id, provider), self.gateway_id,
                      "1" if key else "0"]

    def enter(self, session_id: str, call_id: str, now: float, key: str | None = None,
              provider: str | None = None) -> Ticket:
        """One round trip; `key`: a session key resolved from the cache, checked again here.
        Redis errors propagate (the caller falls back to the uncounted path)."""
        return self.send_enter(session_id, call_id, now, key, provider).ticket()

    def send_enter(self, session_id: str, call_id: str, now: float, key: str | None = None,
                   provider: str | None = None) -> "Entry":
        """`enter` sent now, its answer read by `Entry.ticket()` (or undone by `Entry.withdraw()`:
        one of the two must follow, or the connection stays taken). A Redis error sending it is
        raised by `ticket()`, where `enter` would have raised it."""
        keys, args = self._command(session_id, call_id, now, key, provider)
        entry = Entry(self, session_id, call_id, key, keys, args)
        try:
            entry._sent = self.wire.send([("EVALSHA", self._enter.sha, len(keys), *keys, *args)], 1)
        except Exception as exc:
            entry._error = exc
        return entry

    def leave(self, pipe: Any, session_id: str, call_id: str, counted: bool) -> None:
        """Queue the call's exit on the record's MULTI pipeline."""
        pipe.hdel(self.keys.session_inflight(session_id), call_id)
        if counted:
            pipe.eval(_LEAVE, 1, self.keys.gateway_inflight_by_gateway(), self.gateway_id)


class Entry:
    """A call's admission script, sent (`Admission.send_enter`) and not yet read."""

    __slots__ = ("_admission", "session_id", "call_id", "key", "_keys", "_args", "_sent", "_error", "_ticket")

    def __init__(self, admission: Admission, session_id: str, call_id: str, key: str | None,
                 keys: list[str], args: list[str]):
        self._admission = admission
        self.session_id, self.call_id, self.key = session_id, call_id, key
        self._keys, self._args = keys, args
        self._sent: Replies | None = None
        self._error: Exception | None = None
        self._ticket: Ticket | None = None

    def ticket(self) -> Ticket:
        """The script's answer (read once; later calls return it again). Redis errors raise."""
        if self._ticket is not None:
            return self._ticket
        if self._error is not None:
            raise self._error
        adm, keys, args = self._admission, self._keys, self._args
        try:
            sent, self._sent = self._sent, None
            assert sent is not None  # send_enter sent it, or kept its error
            reply = sent.replies()[0]
            if isinstance(reply, NoScriptError):  # this Redis has not loaded it yet
                reply = adm.wire.execute("EVAL", _ENTER, len(keys), *keys, *args)
            elif isinstance(reply, ResponseError):
                raise reply
        except Exception as exc:
            self._error = exc
            raise
        state, admitted, version = reply
        self._ticket = Ticket(int(state), bool(admitted), None if version in (None, False) else int(version))
        return self._ticket

    def withdraw(self) -> Ticket | None:
        """The call ends before it started (a malformed body, a refused conversion): read the
        answer and take a registered call out of the session's in-flight hash, and out of the
        drain count when it was counted. Never raises (what fails is logged: the call's own
        error is the one its client gets); returns the ticket, or None when Redis did not answer."""
        try:
            ticket = self.ticket()
        except Exception as exc:
            log.warning("admission of call %s unread: %s", self.call_id, exc)
            return None
        if ticket.state != REGISTERED:
            return ticket
        adm = self._admission
        try:
            with adm.r.pipeline(transaction=True) as pipe:
                adm.leave(pipe, self.session_id, self.call_id, ticket.admitted)
                pipe.execute()
        except Exception as exc:
            log.warning("could not take call %s out of flight: %s", self.call_id, exc)
        return ticket
