"""The janitor: hands a stage to a new worker when the one holding it died.

A session in a working state (INITIALIZING, RUNNING, POST_RUN, ...) whose lease lapsed has lost
its worker: its stage task is enqueued again and the new worker takes over. A session whose
runtime's host is gone is re-initialised elsewhere, and messages held by dead workers are put back
(recovery.py). One janitor runs at a time cluster-wide (a Redis lock); every worker runs the loop,
so there is always one.

Tests: tests/pipeline/test_pipeline_faults.py, tests/pipeline/test_fencing_recovery.py.
"""

from __future__ import annotations

import logging
import threading
import time

from polar_mq import states
from polar_mq.tasks.app import causes
from polar_mq.model import SessionRecord
from polar_mq.tasks.app.routing import INIT_TASK, POSTRUN_TASK, RUN_TASK
from polar_mq.tasks.app.context import StageContext
from polar_mq.tasks.worker.recovery import reinitialise, resend_missing_messages, runtime_lost

log = logging.getLogger("polar_mq.janitor")

STAGE_OF: dict[str, str] = {
    states.INITIALIZING: INIT_TASK,
    states.RUNNING: RUN_TASK,
    states.POST_RUN: POSTRUN_TASK,
    states.BUILDING: POSTRUN_TASK,
    states.EVALUATING: POSTRUN_TASK,
}


def orphaned(rec: SessionRecord, has_lease: bool, now: float, ttl: float) -> bool:
    """A session whose worker is gone: in a working state (or REGISTERED but taken by an init
    worker that was waiting for a READY slot), no live lease, and quiet for longer than the TTL."""
    if has_lease or now - rec.updated_at < ttl:
        return False
    if rec.state in STAGE_OF:
        return True
    return rec.state == states.REGISTERED and rec.node is not None


def sweep(ctx: StageContext) -> list[str]:
    """One pass: requeue the stage of every orphaned session. Returns the requeued ids."""
    store, ttl = ctx.store, ctx.settings.lease_ttl
    now = time.time()
    requeued = []
    recs = store.get_sessions(store.active_sessions())
    live = store.live_queues()
    # Every lease and the node table in two round trips, not one or two per active session: a
    # sweep ran 1-2 round trips per active session every janitor_interval, on every sweep.
    leased = store.leases_held([rec.session_id for rec in recs])
    nodes = store.nodes()
    for rec in recs:
        sid = rec.session_id
        has_lease = sid in leased
        if not has_lease and runtime_lost(ctx, rec, live, nodes):
            if rec.attempt + 1 >= ctx.settings.max_attempts:
                give_up(ctx, rec)
            elif reinitialise(ctx, rec):
                requeued.append(sid)
            continue
        if not orphaned(rec, has_lease, now, ttl):
            continue
        if rec.attempt + 1 >= ctx.settings.max_attempts and rec.state != states.REGISTERED:
            give_up(ctx, rec)
            continue
        # One requeue per takeover: while the requeued message waits (a busy worker may hold it,
        # reserved but not started) the session is not requeued again nor charged another attempt.
        if not store.r.set(pending_key(store, sid), 1, nx=True, px=int(PENDING_TTLS * ttl * 1000)):
            continue
        # Touch the record (and count the attempt) so the next sweep waits another TTL.
        if store.transition(sid, None, expect={rec.state}, node=rec.node, attempt=rec.attempt + 1) is None:
            continue
        task_name = STAGE_OF.get(rec.state, INIT_TASK)
        log.warning("session %s in %s lost its worker %s; requeueing %s", sid, rec.state, rec.node, task_name)
        store.incr("sessions_requeued")
        ctx.enqueue(task_name, sid)
        requeued.append(sid)
    requeued += resend_missing_messages(ctx, [r for r in recs if r.session_id not in requeued], now)
    return requeued


PENDING_TTLS = 10  # a requeued message not started within 10 TTLs is requeued again


def pending_key(store, session_id: str) -> str:
    return f"{store.keys.prefix}:janitor:pending:{session_id}"


def give_up(ctx: StageContext, rec: SessionRecord) -> None:
    """Too many takeovers: stop retrying. Sessions before postrun still get a (partial)
    trajectory built; sessions that kept failing in postrun end as ERROR directly."""
    error = f"gave up after {rec.attempt + 1} attempts (last in {rec.state} on {rec.node})"
    cause = causes.last(ctx.store, rec.session_id, rec.attempt)
    if cause:
        error = f"{cause}; {error}"
    log.error("session %s: %s", rec.session_id, error)
    ctx.store.incr("sessions_given_up")
    if rec.state in (states.INITIALIZING, states.READY, states.RUNNING):
        if ctx.store.transition(rec.session_id, states.POST_RUN, expect={rec.state}, outcome=states.ERROR,
                                error=error, attempt=rec.attempt + 1):
            ctx.enqueue(POSTRUN_TASK, rec.session_id)
    else:
        ctx.store.transition(rec.session_id, states.ERROR, expect={rec.state}, error=error)


def reap_orphans(ctx: StageContext) -> int:
    """Kill and report what dead workers left running on this node: process groups of the local,
    bwrap and apptainer runtimes (runtimes/orphans.py) and containers of finished or unknown
    sessions (runtimes/docker.py: sweep). Returns how many runtimes were reaped."""
    from polar_mq.runtimes import orphans
    from polar_mq.runtimes.docker import sweep_now

    n = 0
    try:
        n += len({o.session_id for o in orphans.reap(ctx.store, ctx.settings.node, ctx.settings.redis_url)})
    except Exception:
        log.exception("orphan scan failed")
    removed = sweep_now(ctx.store)
    if removed:
        ctx.store.incr("orphaned_runtimes_reaped", len(removed))
    return n + len(removed)


def start_orphan_reaper(ctx: StageContext, stop: threading.Event | None = None) -> threading.Thread:
    """At worker start, then every `orphan_scan_interval` seconds (0: at start only)."""
    stop = stop or threading.Event()
    interval = ctx.settings.orphan_scan_interval

    def loop() -> None:
        reap_orphans(ctx)
        while interval > 0 and not stop.wait(interval):
            reap_orphans(ctx)

    thread = threading.Thread(target=loop, name="polar-orphan-reaper", daemon=True)
    thread.start()
    return thread
