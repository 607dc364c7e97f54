"""One round trip per session state change: a Lua compare-and-set on the session record.

`PipelineStore.transition` decides in Python (state machine, `expect`, history, timings) on a
record it read, then this script writes the new record only if, in
Redis and in one atomic step, the stored record is still byte-for-byte the one the decision was
made on and the session's lease still holds the writer's fencing token. Otherwise nothing is
written: a lost fence answers 0 (refused, as a WATCH/MULTI would after the lease check), a
changed record answers the current one, on which the caller decides again (the WATCH retry).

With the record the stage last wrote kept in memory, a stage's transition is a single EVALSHA
instead of WATCH + GET + GET lease + MULTI/EXEC; the side effects of the move (a stage-time
histogram observation; for a terminal state: the active set, the READY slot and list, the
counters and the group queue's "last session finished" step) run inside the same script, so they
land atomically with it as they did inside the MULTI.

Tests: tests/store/test_session_cas.py.
"""

from __future__ import annotations

from typing import Any

from polar_mq.store.groups import FINISH_BODY

# READY in/out and its occupancy observation (histograms.py layout, unlabelled).
# KEYS: READY list, slots, wakeup, histogram. ARGV: session id, 'in' | 'out', the bucket bounds.
READY_MOVE_BODY = """
redis.call('LREM', KEYS[1], 0, ARGV[1])
local n
if ARGV[2] == 'in' then
  n = redis.call('LPUSH', KEYS[1], ARGV[1])
else
  redis.call('SREM', KEYS[2], ARGV[1])
  redis.call('LPUSH', KEYS[3], 1)
  redis.call('LTRIM', KEYS[3], 0, 63)
  n = redis.call('LLEN', KEYS[1])
end
local bucket = 'inf'
for i = 3, #ARGV do
  if n <= tonumber(ARGV[i]) then bucket = ARGV[i] break end
end
redis.call('HINCRBY', KEYS[4], '|' .. bucket, 1)
redis.call('HINCRBYFLOAT', KEYS[4], '|sum', n)
redis.call('HINCRBY', KEYS[4], '|count', 1)
return n
"""
from polar_mq.store.core import Keys

# KEYS: 1 session, 2 lease, 3 active set, 4 READY slots, 5 READY wakeup, 6 READY list, 7 counters,
#       8 histogram, 9..14 the group queue's finish keys (terminal set, task sessions, group hash,
#       pending zset, wakeup list, counters), 15 READY occupancy histogram
# ARGV: 1 expected record, 2 new record, 3 fence token ('' = unfenced), 4 '1' if terminal,
#       5 session id, 6 counter field, 7 histogram bucket field ('' = none), 8 sum field,
#       9 count field, 10 observed value, 11 now, 12 task id, 13 '1': release the lease held by
#       the fence token, 14 READY move with the write ('in' | 'out' | ''), 15.. occupancy buckets
SCRIPT = """
local function finish(KEYS, ARGV)
%s
end
local function ready_move(KEYS, ARGV)
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
if ARGV[14] ~= '' then
  ready_move({KEYS[6], KEYS[4], KEYS[5], KEYS[15]}, {ARGV[5], ARGV[14], unpack(ARGV, 15)})
end
if ARGV[13] == '1' and ARGV[3] ~= '' then redis.call('DEL', KEYS[2]) end
return 1
""" % (FINISH_BODY, READY_MOVE_BODY)


def cas_call(keys: Keys, *, session_id: str, task_id: str, expected: bytes, new: bytes, fence: str | None,
             terminal_state: str | None, observation: tuple[str, str, str, float] | None,
             histogram_key: str, now: float, release: bool = False, ready: str = "",
             ready_histogram_key: str = "", ready_buckets: tuple[float, ...] = ()) -> tuple[list[str], list[Any]]:
    """(KEYS, ARGV) of one compare-and-set; `observation` = (bucket, sum, count fields, value).
    `release`: with the write, drop the lease the fence token holds (a stage's last write, one
    round trip less); `ready`: 'in' / 'out' of the READY list with the write (its slot freed on
    'out'), observed into `ready_histogram_key`."""
    bucket, sum_field, count_field, value = observation or ("", "", "", 0.0)
    script_keys = [keys.session(session_id), keys.lease(session_id), keys.active_sessions(), keys.ready_slots(),
                   keys.ready_wakeup(), keys.ready(), keys.counter(), histogram_key,
                   keys.task_terminal(task_id), keys.task_sessions(task_id), keys.group(task_id),
                   keys.groups_pending(), keys.groups_wakeup(), keys.counter(), ready_histogram_key or histogram_key]
    args = [expected, new, fence or "", "1" if terminal_state else "0", session_id,
            f"sessions_{(terminal_state or '').lower()}", bucket, sum_field, count_field, repr(float(value)),
            repr(now), task_id, "1" if release else "", ready, *(repr(float(b)) for b in ready_buckets)]
    return script_keys, args
