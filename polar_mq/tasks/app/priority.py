"""dispatch_priority: higher first, across tasks, for init and READY.

Two places decide what starts next, and both follow the task's priority:
- The stage queues. Each priority level is a list of its own next to the queue's list (kombu's
  Redis layout, `queue\\x06\\x16<level>`), and the workers' BRPOP names the lists highest level
  first (broker.Channel), so an init or run message of a higher task is taken before any lower
  one already queued. Level 0 is the queue's own list: a task without a priority goes where
  every message goes (tests/pipeline/test_dispatch_priority.py). `level()` buckets the integer into the 19 levels -9..9 (kombu's lists per queue).
- The READY buffer. Init workers waiting for a READY slot are registered with their priority;
  a slot goes to the highest one waiting (`try_acquire_slot`), so a high task prepared behind a
  full buffer does not queue behind lower sessions that were waiting longer.

Guarded by tests/pipeline/test_dispatch_priority.py.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:
    from polar_mq.store.pipeline import PipelineStore

LEVELS = 9  # levels -9..9: kombu's Redis transport keeps a message priority between its min and max
SEP = "\x06\x16"  # kombu's Redis transport: `<queue><SEP><level>` is the list of one level
STALE_WAITER = 5.0  # a waiter re-registers at least every second (stages._wait_ready_slot)


def level(priority: int) -> int:
    """The queue level of a dispatch_priority: 0 → 0; ±1 → ±1; ±2..3 → ±2; ±4..7 → ±3; ... ;
    ±256 and beyond → ±9. Order is kept between levels; within one level, first in first out."""
    if priority == 0:
        return 0
    mag = min(LEVELS, abs(int(priority)).bit_length())
    return mag if priority > 0 else -mag


def consume_order() -> list[int]:
    """The levels in the order a worker's BRPOP names them: highest first."""
    return list(range(LEVELS, -LEVELS - 1, -1))


def level_list(queue: str, lvl: int) -> str:
    return f"{queue}{SEP}{lvl}" if lvl else queue


def queue_lists(queue: str) -> list[str]:
    """Every Redis list that holds messages of `queue` (its own list first)."""
    return [queue] + [level_list(queue, lvl) for lvl in consume_order() if lvl]


def depths(r, queues: Iterable[str]) -> dict[str, int]:
    """Messages waiting per queue, every level counted (one round trip)."""
    names = list(queues)
    with r.pipeline(transaction=False) as pipe:
        for q in names:
            for key in queue_lists(q):
                pipe.llen(key)
        counts = [int(n) for n in pipe.execute()]
    width = 2 * LEVELS + 1
    return {q: sum(counts[i * width:(i + 1) * width]) for i, q in enumerate(names)}


def task_level(store: PipelineStore, session_id: str) -> int:
    """The queue level of the task a session belongs to (0 when unknown). Session ids are
    `<task id>-<index>-<suffix>` (PipelineStore.create_task): the task is found from the id and
    its parsed request cached per process, so a hand-off decodes no record for this."""
    head = session_id.rsplit("-", 2)[0]
    task = store.cached_task_request(head) if head != session_id else None
    if task is None:
        rec = store.known_session(session_id)
        task = store.cached_task_request(rec.task_id) if rec is not None else None
    return level(task.dispatch_priority) if task is not None else 0


# A READY slot for a session, the highest priority waiting first. KEYS: slots, capacity, waiting
# (zset: session -> priority), seen (zset: session -> last registration), wakeup list.
# ARGV: session id, default capacity, priority, now, stale age.
_ACQUIRE = """
local now = tonumber(ARGV[4])
for _, sid in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now - tonumber(ARGV[5]))) do
  redis.call('ZREM', KEYS[3], sid)
  redis.call('ZREM', KEYS[4], sid)
end
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('ZREM', KEYS[4], ARGV[1])
  return 1
end
local cap = tonumber(redis.call('GET', KEYS[2]) or ARGV[2])
local room = redis.call('SCARD', KEYS[1]) < cap
local top = redis.call('ZREVRANGE', KEYS[3], 0, 0, 'WITHSCORES')
if room and (#top == 0 or top[1] == ARGV[1] or tonumber(top[2]) <= tonumber(ARGV[3])) then
  redis.call('SADD', KEYS[1], ARGV[1])
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('ZREM', KEYS[4], ARGV[1])
  return 1
end
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1])
redis.call('ZADD', KEYS[4], now, ARGV[1])
if room then
  redis.call('LPUSH', KEYS[5], 1)  -- room, but a higher waiter's turn: pass the wakeup on
  redis.call('LTRIM', KEYS[5], 0, 63)
end
return 0
"""


_SCRIPTS: dict[int, Any] = {}  # per Redis client


def _keys(store: PipelineStore) -> list[str]:
    k = store.keys
    return [k.ready_slots(), k.ready_capacity(), f"{k.prefix}:ready:waiting", f"{k.prefix}:ready:waiting:seen",
            k.ready_wakeup()]


def try_acquire_slot(store: PipelineStore, session_id: str, default_capacity: int, priority: int) -> bool:
    """A READY slot for this session if there is room and no higher-priority session waits; else
    the session is registered as waiting (until it gets one or stops re-registering)."""
    script = _SCRIPTS.get(id(store.r))
    if script is None:
        script = _SCRIPTS[id(store.r)] = store.r.register_script(_ACQUIRE)
    return bool(script(keys=_keys(store), args=[session_id, default_capacity, int(priority), time.time(),
                                                 STALE_WAITER]))


def waiting(store: PipelineStore) -> list[tuple[str, float]]:
    """Sessions waiting for a READY slot, highest priority first: [(session id, priority)]."""
    raw: list[Any] = list(store.r.zrevrange(_keys(store)[2], 0, -1, withscores=True))
    return [(pair[0].decode() if isinstance(pair[0], bytes) else str(pair[0]), float(pair[1])) for pair in raw]
