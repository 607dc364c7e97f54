"""Celery tasks: thin wrappers that call the stage functions. Started by `polar-mq worker`."""

from __future__ import annotations

import json
import os
import logging
import threading

from celery.signals import worker_process_init, worker_ready

from polar_mq.store.pipeline import PipelineStore
from polar_mq import runtimes
from polar_mq.runtimes import orphans
from polar_mq.settings import PipelineSettings
from polar_mq.store.core import GatewayStore, connect
from polar_mq.tasks.app import callback_guard
from polar_mq.tasks.app import callbacks
from polar_mq.tasks.worker import stages
from polar_mq.tasks.app.celery import make_celery
from polar_mq.tasks.app.context import GatewayClient, StageContext
from polar_mq.tasks.app.publish import sender
from polar_mq.tasks.worker.housekeeping import start_janitor, start_node_beat
from polar_mq.tasks.worker.janitor import start_orphan_reaper
from polar_mq.tasks.app.routing import CALLBACK_TASK, INIT_TASK, POSTRUN_TASK, RUN_TASK, make_enqueue

runtimes.preload_docker_sdk()  # before the pool's threads: a concurrent first import breaks

log = logging.getLogger("polar_mq.worker")

settings = PipelineSettings.from_env()
app = make_celery(settings)
if not settings.task_log:  # per-task INFO lines off (settings.task_log); before tracers are built
    for name in ("celery.app.trace", "celery.worker.strategy"):
        logging.getLogger(name).setLevel(logging.WARNING)
_ctx: StageContext | None = None
_ctx_lock = threading.Lock()


def context() -> StageContext:
    """Per-process context (Redis connections must not cross a fork), shared by every slot of a
    threads pool: built once under a lock (its Redis client's pool is thread-safe)."""
    global _ctx
    if _ctx is not None:
        return _ctx
    with _ctx_lock:
        if _ctx is not None:
            return _ctx
        orphans.set_scope(settings.node, settings.redis_url)  # marks the runtimes this process starts
        store = PipelineStore(connect(settings.redis_url, ride_out_outages=60))
        _ctx = StageContext(settings=settings, store=store,
                            gateway=GatewayClient(settings.gateway_url, settings.gateway_token,
                                                  direct=GatewayStore(store.r)),  # if shared: context.py
                            enqueue=make_enqueue(sender(app, store.r, settings.redis_url), store), node=f"{settings.node}:{os.getpid()}")
    return _ctx


@worker_process_init.connect
def _reset_after_fork(**_: object) -> None:
    global _ctx, _ctx_lock
    _ctx = None
    _ctx_lock = threading.Lock()


@worker_ready.connect
def _janitor(sender=None, **_: object) -> None:
    ctx = context()
    start_orphan_reaper(ctx)  # what a dead worker left on this node: killed and reported
    start_janitor(ctx)
    queues = sorted(getattr(app.amqp.queues, "consume_from", None) or app.amqp.queues)
    concurrency = getattr(getattr(sender, "controller", None), "concurrency", None)
    start_node_beat(ctx, f"{getattr(sender, 'hostname', 'worker')}",
                    {"queues": queues, "concurrency": concurrency})


def _run_stage(task, stage, session_id: str) -> str:
    """A stage that finds the session held ("busy") retries shortly: either the holder finishes
    and the stage then sees the state advanced (a duplicate, skipped), or the holder died and its
    lease lapses (a takeover)."""
    result = stage(context(), session_id)
    if result == "busy":
        raise task.retry(countdown=max(0.5, settings.lease_ttl / 3), max_retries=60)
    return result


@app.task(name=INIT_TASK, bind=True)
def init_task(self, session_id: str) -> str:
    return _run_stage(self, stages.init_session, session_id)


@app.task(name=RUN_TASK, bind=True)
def run_task(self, session_id: str) -> str:
    return _run_stage(self, stages.run_session, session_id)


@app.task(name=POSTRUN_TASK, bind=True)
def postrun_task(self, session_id: str) -> str:
    return _run_stage(self, stages.postrun_session, session_id)


@app.task(name=CALLBACK_TASK, bind=True, max_retries=None)
def callback_task(self, message: str) -> str:
    """POST a signed result to the trainer's callback URL (tasks/callbacks.py), retrying with
    capped exponential backoff; the delivery state is kept in the task's status, the last one
    ``dead_letter`` when the retries are spent."""
    data = json.loads(message)
    store = context().store
    attempts = self.request.retries + 1
    refusal = callback_guard.refused(data["url"])  # again at delivery: DNS may have changed since submit
    if refusal is not None:
        callbacks.record(store, data, "dead_letter", attempts, f"refused: callback_url {refusal}")
        store.incr("callbacks_failed")
        return "dead_letter"
    error = callbacks.deliver(data, callback_guard.callback_secret(settings.callback_token))
    if error is None:
        callbacks.record(store, data, "delivered", attempts, None)
        store.incr("callbacks_delivered")
        return "delivered"
    if self.request.retries >= settings.callback_retries:
        log.error("callback %s to %s dead-lettered after %d attempts: %s", data.get("delivery_id"), data["url"],
                  attempts, error)
        callbacks.record(store, data, "dead_letter", attempts, error)
        store.incr("callbacks_failed")
        return "dead_letter"
    callbacks.record(store, data, "retrying", attempts, error)
    delay = min(60.0, settings.callback_backoff * 2 ** self.request.retries)
    raise self.retry(countdown=delay)
