"""The worker's housekeeping threads: the janitor's loop (lost messages, held messages, orphaned
containers, and once a second the host watch), its retention pass and this node's heartbeat. Apart from janitor.py
(what a sweep does) and host_loss.py (when a node counts as lost), which both build on janitor's
helpers: no cycle between them (tests/pipeline/test_layout.py)."""

from __future__ import annotations

import logging
import threading
import time

from polar_mq.tasks.app.context import StageContext
from polar_mq.tasks.worker.host_loss import STALL, HostWatch, beat_interval, check_interval, node_timeout
from polar_mq.tasks.worker.janitor import sweep
from polar_mq.tasks.worker.leftovers import tear_down_leftovers
from polar_mq.tasks.worker.recovery import restore_held_messages
from polar_mq.tasks.worker.retention_sweep import run_pass as retention_pass

log = logging.getLogger("polar_mq.janitor")


def start_janitor(ctx: StageContext, stop: threading.Event | None = None) -> threading.Thread:
    stop = stop or threading.Event()
    interval = ctx.settings.janitor_interval

    hosts = HostWatch(ctx)
    every = min(interval, check_interval(ctx.settings.host_loss_seconds))
    next_sweep = time.monotonic() + interval

    def loop() -> None:
        nonlocal next_sweep
        while not stop.wait(every):
            try:  # once a second: a node that stopped beating (host_loss.py)
                asked = time.monotonic()
                mine = ctx.store.r.set(ctx.store.keys.janitor_lock() + ":hosts", ctx.node, nx=True,
                                       px=int(every * 1000))
                if time.monotonic() - asked > STALL:
                    hosts.failed()
                elif mine:
                    hosts.tick()
            except Exception:
                hosts.failed()
                log.warning("host watch failed", exc_info=True)
            if time.monotonic() < next_sweep:
                continue
            next_sweep = time.monotonic() + interval
            try:
                if ctx.store.r.set(ctx.store.keys.janitor_lock(), ctx.node, nx=True, px=int(interval * 1000)):
                    sweep(ctx)
                    restore_held_messages(ctx)
                    from polar_mq.runtimes.docker import maybe_sweep  # orphaned session containers

                    reaped = maybe_sweep(ctx.store)
                    if reaped:  # reported: polar_mq_orphaned_runtimes_reaped_total in /metrics
                        ctx.store.incr("orphaned_runtimes_reaped", len(reaped))
            except Exception:
                log.exception("janitor sweep failed")

    thread = threading.Thread(target=loop, name="polar-janitor", daemon=True)
    thread.start()
    start_retention(ctx, stop)
    return thread


def start_retention(ctx: StageContext, stop: threading.Event) -> threading.Thread | None:
    """The retention pass (retention_sweep.py) in a thread of its own: a long pass never delays
    the host watch. First pass one interval after start."""
    interval = ctx.settings.retention_sweep_interval
    if interval <= 0:
        return None

    def loop() -> None:
        while not stop.wait(interval):
            try:
                retention_pass(ctx)
            except Exception:
                log.exception("retention pass failed")

    thread = threading.Thread(target=loop, name="polar-retention", daemon=True)
    thread.start()
    return thread


def start_node_beat(ctx: StageContext, pool_id: str, info: dict, stop: threading.Event | None = None
                    ) -> threading.Thread:
    """Tell the cluster this node (and this pool on it) is alive: the sessions of a node that stops
    beating move on elsewhere within host_loss_seconds (host_loss.py)."""
    stop = stop or threading.Event()
    ttl = node_timeout(ctx.settings.host_loss_seconds)

    def loop() -> None:
        while True:
            try:
                ctx.store.beat_node(ctx.settings.node, pool_id, info, ttl)
                tear_down_leftovers(ctx.store, ctx.settings.node)  # runtimes a partition left here
            except Exception:
                log.debug("node beat failed", exc_info=True)
            if stop.wait(min(ctx.settings.janitor_interval, ctx.settings.lease_ttl / 3,
                             beat_interval(ctx.settings.host_loss_seconds))):
                return

    thread = threading.Thread(target=loop, name="polar-node-beat", daemon=True)
    thread.start()
    return thread
