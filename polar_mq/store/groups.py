"""The durable queue of finished groups (a task = a GRPO group of `num_samples` sessions).

The message-queue way, all in Redis so it survives API and worker restarts:
- A group becomes available in the same MULTI/EXEC that moves its last session to a terminal
  state (`finish_script`, queued by `PipelineStore.transition`): no window in which a crash
  between "last session done" and "group enqueued" could lose it.
- `take` leases up to N groups, oldest-finished first, for `lease` seconds and counts the
  hand-outs (`delivery`); a lease that runs out puts the group back at its finished-time place.
- `ack` removes it for good; an ack after the lease ran out still acks (at-least-once).

Layout (names in `store.Keys`): `groups:pending` ZSET task → finished_at, `groups:leased` ZSET
task → lease expiry, `group:<task>` hash (finished_at, delivery, leased_until, acked_at,
ack_reason), `task:<task>:terminal` SET of terminal sessions, `groups:wakeup` list (wakes
long-polling `wait`ers). The scripts build `group:<task>` names from a prefix, so they need a
single Redis node (no Redis Cluster), as the rest of the pipeline does.

Tests: tests/api/test_groups.py.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import redis

from polar_mq.store import replicated
from polar_mq.store import replies
from polar_mq.store.core import Keys

WAKE_CAP = 63  # tokens kept in the wakeup list; more only cause spurious wake-ups
POLL_CAP = 0.25  # a waiter re-checks at least this often (lease expiries, other waiters' tokens)

# KEYS: terminal set, task sessions list, group hash, pending zset, wakeup list, counters
# ARGV: session id, now, task id
_FINISH = """
redis.call('SADD', KEYS[1], ARGV[1])
local total = redis.call('LLEN', KEYS[2])
if total > 0 and redis.call('SCARD', KEYS[1]) >= total then
  if redis.call('HSETNX', KEYS[3], 'finished_at', ARGV[2]) == 1 then
    redis.call('HSET', KEYS[3], 'delivery', 0)
    redis.call('ZADD', KEYS[4], ARGV[2], ARGV[3])
    redis.call('LPUSH', KEYS[5], ARGV[3])
    redis.call('LTRIM', KEYS[5], 0, %d)
    redis.call('HINCRBY', KEYS[6], 'groups_finished', 1)
    return 1
  end
end
return 0
""" % WAKE_CAP
FINISH_BODY = _FINISH  # also run as a function inside the session compare-and-set (session_cas.py)

# KEYS: pending zset, leased zset, counters. ARGV: now, lease seconds, limit, group-hash prefix
_TAKE = """
local now = tonumber(ARGV[1])
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
for _, id in ipairs(expired) do
  redis.call('ZREM', KEYS[2], id)
  local g = ARGV[4] .. id
  if redis.call('HEXISTS', g, 'acked_at') == 0 then
    local fin = redis.call('HGET', g, 'finished_at')
    if fin then
      redis.call('ZADD', KEYS[1], fin, id)
      redis.call('HINCRBY', KEYS[3], 'groups_lease_expired', 1)
    end
  end
end
local out = {}
local ids = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[3]) - 1)
local until_ = now + tonumber(ARGV[2])
for _, id in ipairs(ids) do
  local g = ARGV[4] .. id
  redis.call('ZREM', KEYS[1], id)
  redis.call('ZADD', KEYS[2], until_, id)
  local d = redis.call('HINCRBY', g, 'delivery', 1)
  redis.call('HSET', g, 'leased_until', until_)
  redis.call('HINCRBY', KEYS[3], 'groups_delivered', 1)
  if d > 1 then redis.call('HINCRBY', KEYS[3], 'groups_redelivered', 1) end
  table.insert(out, id)
  table.insert(out, d)
end
return out
"""

# KEYS: group hash, pending, leased, counters. ARGV: task id, now, reason
# → -1 not finished, 0 already acked, 1 acked now
_ACK = """
if redis.call('HEXISTS', KEYS[1], 'finished_at') == 0 then return -1 end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
if redis.call('HSETNX', KEYS[1], 'acked_at', ARGV[2]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'ack_reason', ARGV[3])
redis.call('HINCRBY', KEYS[4], 'groups_acked', 1)
if ARGV[3] ~= '' then redis.call('HINCRBY', KEYS[4], 'groups_acked_' .. ARGV[3], 1) end
return 1
"""

ACK_REASONS = ("", "trained", "stale", "unusable", "skipped")


@dataclass
class Taken:
    """One group handed out by `take`: its task id and how many times it has been handed out."""

    task_id: str
    delivery: int


class GroupQueue:
    def __init__(self, client: redis.Redis, keys: Keys):
        self.r = client
        self.keys = keys
        self.finish_script = self.r.register_script(_FINISH)
        self._take = self.r.register_script(_TAKE)
        self._ack = self.r.register_script(_ACK)

    def queue_finish(self, pipe: Any, task_id: str, session_id: str, now: float) -> None:
        """Queue, inside the caller's MULTI, "this session is terminal; enqueue the group if it
        was the last one"."""
        k = self.keys
        self.finish_script(keys=[k.task_terminal(task_id), k.task_sessions(task_id), k.group(task_id),
                                 k.groups_pending(), k.groups_wakeup(), k.counter()],
                           args=[session_id, repr(now), task_id], client=pipe)

    def take(self, limit: int, lease: float, now: float | None = None) -> list[Taken]:
        k = self.keys
        flat = self._take(keys=[k.groups_pending(), k.groups_leased(), k.counter()],
                          args=[repr(now if now is not None else time.time()), repr(float(lease)),
                                int(limit), k.group_prefix()])
        return [Taken(flat[i].decode(), int(flat[i + 1])) for i in range(0, len(flat), 2)]

    def take_waiting(self, limit: int, lease: float, wait: float) -> list[Taken]:
        """`take`, long-polling up to `wait` seconds: returns as soon as a group finishes or a
        lease runs out (woken by the finish script's token, re-checking at least every POLL_CAP)."""
        deadline = time.monotonic() + wait
        while True:
            got = self.take(limit, lease)
            remaining = deadline - time.monotonic()
            if got or remaining <= 0:
                return got
            timeout = min(remaining, POLL_CAP, self._until_next_expiry())
            if timeout > 0.001:
                self.r.blpop([self.keys.groups_wakeup()], timeout=timeout)

    def _until_next_expiry(self) -> float:
        first = replies.scored(self.r.zrange(self.keys.groups_leased(), 0, 0, withscores=True))
        return max(0.0, first[0][1] - time.time()) if first else POLL_CAP

    def ack(self, task_id: str, reason: str = "") -> int:
        k = self.keys
        return int(replicated.run_script(self.r, self._ack,
                                         [k.group(task_id), k.groups_pending(), k.groups_leased(), k.counter()],
                                         [task_id, repr(time.time()), reason], "group ack"))

    def info(self, task_id: str) -> dict[str, Any]:
        raw = replies.text_map(self.r.hgetall(self.keys.group(task_id)))
        out: dict[str, Any] = {}
        for name, value in raw.items():
            text = value.decode()
            out[name] = text if name == "ack_reason" else float(text)
        if "delivery" in out:
            out["delivery"] = int(out["delivery"])
        return out

    def stats(self) -> dict[str, Any]:
        k = self.keys
        with self.r.pipeline(transaction=False) as pipe:
            pipe.zcard(k.groups_pending())
            pipe.zcard(k.groups_leased())
            pipe.zrangebyscore(k.groups_leased(), "-inf", time.time())
            pipe.zrange(k.groups_pending(), 0, 0, withscores=True)
            pipe.hgetall(k.counter())
            pending, leased, expired, oldest, counters = pipe.execute()
        counts = {key.decode(): int(float(v)) for key, v in counters.items()
                  if key.decode().startswith("groups_")}
        return {
            "pending": int(pending) + len(expired),
            "leased": int(leased) - len(expired),
            "oldest_pending_age_s": round(time.time() - oldest[0][1], 3) if oldest else None,
            "finished": counts.pop("groups_finished", 0),
            "delivered": counts.pop("groups_delivered", 0),
            "redelivered": counts.pop("groups_redelivered", 0),
            "lease_expired": counts.pop("groups_lease_expired", 0),
            "acked": counts.pop("groups_acked", 0),
            "acked_by_reason": {name[len("groups_acked_"):]: n for name, n in counts.items()
                                if name.startswith("groups_acked_")},
        }
