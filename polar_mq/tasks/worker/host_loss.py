"""Host loss by heartbeats: a node whose beat stops is fenced and its sessions move on within
`host_loss_seconds` (POLAR_HOST_LOSS_SECONDS, default 10) when the lease TTL allows it: the bound
is max(0.6 × host_loss_seconds, 0.6 × POLAR_LEASE_TTL + 2.5 s + TTL/6) + one check (1 s), so
≤ 10 s with the defaults (host_loss_seconds 10, POLAR_LEASE_TTL 8: 9.6 s; `bound` below,
tests/pipeline/test_host_loss.py; docs/deployment.md). A longer TTL lengthens the bound.

Every worker process beats for its node every `beat_interval` (node table: node -> expiry, written
`node_timeout` ahead). Once a second one janitor (a Redis lock) reads the node table; a node whose
expiry passed is dead. For each active session it was working on — its lease token names the node
(Lease(node=...)), or its runtime lives there — the lease is deleted if it still holds that token
(compare-and-delete: the fence; every later write of the old holder is refused, session_cas.py),
once its holder, were it only cut off, has fenced itself (SELF_FENCE × lease TTL + the harness
kill after its last renewal: never two live attempts); then the session moves on as after any
worker loss: a session bound to the runtime there (READY/RUNNING) is prepared again elsewhere (recovery.reinitialise: a new attempt, a fresh gateway
session), one in another stage gets that stage again (a counted attempt). Once none of its
sessions is left waiting, the node's entry is dropped so the next tick does not scan again.

No verdict while the watcher itself could not see Redis for a while (a Redis outage or failover
stops every beat at once): it waits `node_timeout` of Redis answering before it judges, by then live
nodes have beaten again. A node that was only cut off self-fences (lease.py: its holders
stop once renewals fail for SELF_FENCE × lease TTL); its writes are refused from the fence on.
tests/pipeline/test_host_loss.py measures the time from kill -9 of a host to its sessions moving on.
"""

from __future__ import annotations

import logging
import time

from polar_mq.tasks.app.context import StageContext
from polar_mq.tasks.worker.janitor import PENDING_TTLS, STAGE_OF, give_up, pending_key
from polar_mq.tasks.worker.lease import SELF_FENCE
from polar_mq.tasks.worker.recovery import RUNTIME_BOUND, reinitialise

HARNESS_KILL = 2.5  # a self-fenced holder's harness stop: SIGTERM, SIGKILL 2 s later (lease.py)

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


def bound(host_loss_seconds: float, lease_ttl: float) -> float:
    """The longest a dead node's sessions wait before they move on: its beat must be stale, and
    a holder that was only cut off must have fenced itself and stopped its harness (counted from
    its last renewal, at most TTL/6 before the loss), then one check."""
    holder = SELF_FENCE * lease_ttl + HARNESS_KILL + lease_ttl / 6
    return max(node_timeout(host_loss_seconds), holder) + check_interval(host_loss_seconds)


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
        moved, waiting = self.fence(set(dead))
        for name, value in dead.items():
            if name not in waiting:
                self._forget(keys=[store._nodes_key()], args=[name, value])
        return moved

    def fence(self, dead: set[str]) -> tuple[list[str], set[str]]:
        """(sessions moved on, dead nodes with a session whose holder may still be stopping)."""
        ctx, store = self.ctx, self.ctx.store
        recs = store.get_sessions(store.active_sessions())
        waiting: set[str] = set()
        if not recs:
            return [], waiting
        tokens = store.r.mget([store.keys.lease(r.session_id) for r in recs])
        ttl = ctx.settings.lease_ttl
        moved = []
        for rec, raw in zip(recs, tokens):
            token = raw.decode() if isinstance(raw, bytes) else raw
            holder = lease_node(token)
            bound = rec.state in RUNTIME_BOUND and rec.runtime_host in dead
            if not bound and not (holder in dead and rec.state in STAGE_OF):
                continue
            if token is not None and holder is not None and holder not in dead:
                continue  # a live node holds it (it took over already)
            if token is not None:
                if not self._holder_stopped(store.r.pttl(store.keys.lease(rec.session_id)), ttl):
                    waiting.add(holder or rec.runtime_host or "")  # not yet: the next tick looks again
                    continue
                self._fence(keys=[store.keys.lease(rec.session_id)], args=[token])
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
        return moved, waiting

    @staticmethod
    def _holder_stopped(pttl_ms: int, ttl: float) -> bool:
        """Whether a holder that was cut off rather than dead has fenced itself and stopped its
        harness by now: its last renewal (the lease's TTL minus what is left of it) is more than
        SELF_FENCE × TTL + the harness kill ago. Until then its lease is not taken: never two
        live attempts (tests/pipeline/test_host_loss.py)."""
        if pttl_ms is None or pttl_ms < 0:
            return True  # gone, or no expiry
        since_renewal = ttl - pttl_ms / 1000.0
        return since_renewal >= SELF_FENCE * ttl + HARNESS_KILL

    def _requeue(self, rec) -> bool:
        ctx, store = self.ctx, self.ctx.store
        sid, ttl = rec.session_id, ctx.settings.lease_ttl
        if not store.r.set(pending_key(store, sid), 1, nx=True, px=int(PENDING_TTLS * ttl * 1000)):
            return False
        if store.transition(sid, None, expect={rec.state}, node=rec.node, attempt=rec.attempt + 1) is None:
            return False
        ctx.enqueue(STAGE_OF[rec.state], sid)
        return True
