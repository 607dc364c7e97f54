"""One round trip per session state change: a Lua compare-and-set on the session record.

`PipelineStore.transition` decides in Python (state machine, `expect`, history, timings — the
same code as before) on a record it read, then this script writes the new record only if, in
Redis and in one atomic step, the stored record is still byte-for-byte the one the decision was
made on and the session's lease still holds the writer's fencing token. Otherwise nothing is
written: a lost fence answers 0 (refused, as a WATCH/MULTI would after the lease check), a
changed record answers the current one, on which the caller decides again (the WATCH retry).

With the record the stage last wrote kept in memory, a stage's transition is a single EVALSHA
instead of WATCH + GET + GET lease + MULTI/EXEC; the side effects of the move (a stage-time
histogram observation; for a terminal state: the active set, the READY slot and list, the
counters and the group queue's "last session finished" step) run inside the same script, so they
land atomically with it as they did inside the MULTI.
"""

from __future__ import annotations

from typing import Any

from .group_queue import FINISH_BODY
from .store import Keys

# KEYS: 1 session, 2 lease, 3 active set, 4 READY slots, 5 READY wakeup, 6 READY list, 7 counters,
#       8 histogram, 9..14 the group queue's finish keys (terminal set, task sessions, group hash,
#       pending zset, wakeup list, counters)
# ARGV: 1 expected record, 2 new record, 3 fence token ('' = unfenced), 4 '1' if terminal,
#       5 session id, 6 counter field, 7 histogram bucket field ('' = none), 8 sum field,
#       9 count field, 10 observed value, 11 now, 12 task id
SCRIPT = """
local function finish(KEYS, ARGV)
%s
end
local cur = redis.call('GET', KEYS[1])
if not cur then return 0 end
if ARGV[3] ~= '' and redis.call('GET', KEYS[2]) ~= ARGV[3] then return 0 end
if cur ~= ARGV[1] then return cur end
redis.call('SET', KEYS[1], ARGV[2])
if ARGV[7] ~= '' then
  redis.call('HINCRBY', KEYS[8], ARGV[7], 1)
  redis.call('HINCRBYFLOAT', KEYS[8], ARGV[8], ARGV[10])
  redis.call('HINCRBY', KEYS[8], ARGV[9], 1)
end
if ARGV[4] == '1' then
  redis.call('SREM', KEYS[3], ARGV[5])
  redis.call('SREM', KEYS[4], ARGV[5])
  redis.call('LPUSH', KEYS[5], 1)
  redis.call('LREM', KEYS[6], 0, ARGV[5])
  redis.call('HINCRBY', KEYS[7], ARGV[6], 1)
  finish({KEYS[9], KEYS[10], KEYS[11], KEYS[12], KEYS[13], KEYS[14]}, {ARGV[5], ARGV[11], ARGV[12]})
end
return 1
""" % FINISH_BODY


def cas_call(keys: Keys, *, session_id: str, task_id: str, expected: bytes, new: bytes, fence: str | None,
             terminal_state: str | None, observation: tuple[str, str, str, float] | None,
             histogram_key: str, now: float) -> tuple[list[str], list[Any]]:
    """(KEYS, ARGV) of one compare-and-set; `observation` = (bucket, sum, count fields, value)."""
    bucket, sum_field, count_field, value = observation or ("", "", "", 0.0)
    script_keys = [keys.session(session_id), keys.lease(session_id), keys.active_sessions(), keys.ready_slots(),
                   keys.ready_wakeup(), keys.ready(), keys.counter(), histogram_key,
                   keys.task_terminal(task_id), keys.task_sessions(task_id), keys.group(task_id),
                   keys.groups_pending(), keys.groups_wakeup(), keys.counter()]
    args = [expected, new, fence or "", "1" if terminal_state else "0", session_id,
            f"sessions_{(terminal_state or '').lower()}", bucket, sum_field, count_field, repr(float(value)),
            repr(now), task_id]
    return script_keys, args
