"""Host loss by heartbeats: a node whose beat stops is fenced and its sessions move on within
`host_loss_seconds` (POLAR_HOST_LOSS_SECONDS, default 10), without waiting for their leases to lapse.

Every worker process beats for its node every `beat_interval` (node table: node -> expiry, written
`node_timeout` ahead). Once a second one janitor (a Redis lock) reads the node table; a node whose
expiry passed is dead. For each active session it was working on — its lease token names the node
(Lease(node=...)), or its runtime lives there — the lease is deleted if it still holds that token
(compare-and-delete: the fence; every later write of the old holder is refused, session_cas.py),
and then the session moves on as after any worker loss: a session bound to the runtime there
(READY/RUNNING) is prepared again elsewhere (recovery.reinitialise: a new attempt, a fresh gateway
session), one in another stage gets that stage again (a counted attempt). The node's entry is
then dropped so the next tick does not scan again.

No verdict while the watcher itself could not see Redis for a while (a Redis outage or failover
stops every beat at once): it waits `node_timeout` of Redis answering before it judges, by then live
nodes have beaten again. A node that was only cut off self-fences as before (lease.py: its holders
stop once renewals fail for SELF_FENCE × lease TTL); its writes are refused from the fence on.
tests/test_host_loss.py measures the time from kill -9 of a host to its sessions moving on.
"""

from __future__ import annotations

import logging
import time

from .context import StageContext
from .janitor import PENDING_TTLS, STAGE_OF, give_up, pending_key
from .recovery import RUNTIME_BOUND, reinitialise

log = logging.getLogger("polar_mq.host_loss")

STALL = 1.0  # seconds a Redis call may take before it counts as an outage seen

# Delete a lease only if it still holds the token judged (a new holder's lease stays).
_FENCE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
# Drop a dead node's entry only if it did not beat meanwhile.
_FORGET = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then return redis.call('HDEL', KEYS[1], ARGV[1]) end
return 0
"""


def node_timeout(host_loss_seconds: float) -> float:
    """A node's beat counts for this long (detection ≤ timeout + one check, below the bound)."""
    return 0.6 * host_loss_seconds


def beat_interval(host_loss_seconds: float) -> float:
    return node_timeout(host_loss_seconds) / 4


def check_interval(host_loss_seconds: float) -> float:
    return max(0.2, min(1.0, 0.2 * host_loss_seconds))


def lease_node(token: str | None) -> str | None:
    """The node in a lease token `<node>:<pid>:<random>` (lease.Lease)."""
    if not token or token.count(":") < 2:
        return None
    return token.rsplit(":", 2)[0]


class HostWatch:
    """The janitor's once-a-second look at the node table (`tick`)."""

    def __init__(self, ctx: StageContext):
        self.ctx = ctx
        self.timeout = node_timeout(ctx.settings.host_loss_seconds)
        self.redis_ok_since = time.monotonic()
        self._fence = ctx.store.r.register_script(_FENCE)
        self._forget = ctx.store.r.register_script(_FORGET)

    def failed(self) -> None:
        """Redis did not answer: judge nobody until it has answered for `timeout` again."""
        self.redis_ok_since = time.monotonic()

    def tick(self) -> list[str]:
        if time.monotonic() - self.redis_ok_since < self.timeout:
            return []
        store = self.ctx.store
        asked = time.monotonic()
        raw = store.r.hgetall(store._nodes_key())
        if time.monotonic() - asked > STALL:  # it waited for Redis (clients retry through outages)
            self.failed()
            return []
        now = time.time()
        dead = {}
        for k, v in raw.items():
            name = k.decode() if isinstance(k, bytes) else str(k)
            if float(v) <= now:
                dead[name] = v
        if not dead:
            return []
        moved = self.fence(set(dead))
        for name, value in dead.items():
            self._forget(keys=[store._nodes_key()], args=[name, value])
        return moved

    def fence(self, dead: set[str]) -> list[str]:
        ctx, store = self.ctx, self.ctx.store
        recs = store.get_sessions(store.active_sessions())
        if not recs:
            return []
        tokens = store.r.mget([store.keys.lease(r.session_id) for r in recs])
        moved = []
        for rec, raw in zip(recs, tokens):
            token = raw.decode() if isinstance(raw, bytes) else raw
            holder = lease_node(token)
            bound = rec.state in RUNTIME_BOUND and rec.runtime_host in dead
            if not bound and not (holder in dead and rec.state in STAGE_OF):
                continue
            if token is not None and (holder in dead or holder is None):
                self._fence(keys=[store.keys.lease(rec.session_id)], args=[token])
            elif token is not None:
                continue  # a live node holds it (it took over already)
            log.warning("session %s in %s: node %s stopped beating; fenced, moving on", rec.session_id,
                        rec.state, rec.runtime_host if bound else holder)
            store.incr("sessions_host_lost")
            if rec.attempt + 1 >= ctx.settings.max_attempts:
                give_up(ctx, rec)
            elif bound:
                if reinitialise(ctx, rec):
                    moved.append(rec.session_id)
            elif self._requeue(rec):
                moved.append(rec.session_id)
        return moved

    def _requeue(self, rec) -> bool:
        ctx, store = self.ctx, self.ctx.store
        sid, ttl = rec.session_id, ctx.settings.lease_ttl
        if not store.r.set(pending_key(store, sid), 1, nx=True, px=int(PENDING_TTLS * ttl * 1000)):
            return False
        if store.transition(sid, None, expect={rec.state}, node=rec.node, attempt=rec.attempt + 1) is None:
            return False
        ctx.enqueue(STAGE_OF[rec.state], sid)
        return True
