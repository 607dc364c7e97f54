"""Where every stage message goes: the Celery task names, their queues, the per-node queues.

One place for both, so the rollout API (which only sends), the stage workers (which define and
consume the tasks) and the Celery app's configuration cannot disagree. Nothing here imports stage
or runtime code: the API loads this module to send init messages.

Host-aware routing: init is shared (any init worker on any host may prepare a session). The
runtime it starts is stamped with its node (model.RuntimeHandle.host); from then on the session's
RUN and POSTRUN messages go to the per-node queues `run@NODE` / `postrun@NODE`, which only that
node's pools consume (next to the shared `run` / `postrun`, which they consume too). A postrun
whose runtime's node is gone goes to the shared queue (it can build and grade from the gateway's
calls; teardown is skipped). A run whose node is gone is never sent anywhere: the janitor
re-initialises the session.

Tests: tests/pipeline/test_publish.py, tests/pipeline/test_many_hosts.py.
"""

from __future__ import annotations

from typing import Any, Callable

from polar_mq.store.pipeline import PipelineStore
from polar_mq.tasks.app.priority import task_level

# Task names: constants, so senders never import the task functions (tasks/worker.py).
INIT_TASK = "polar_mq.init"
RUN_TASK = "polar_mq.run"
POSTRUN_TASK = "polar_mq.postrun"
CALLBACK_TASK = "polar_mq.callback"

# The stage pools and their shared queues (`polar-mq worker --stage`).
QUEUES = ("init", "run", "postrun")
# The shared queue of each task; callbacks ride with postrun.
STAGE_QUEUE = {INIT_TASK: "init", RUN_TASK: "run", POSTRUN_TASK: "postrun", CALLBACK_TASK: "postrun"}
NODE_BOUND = {"run", "postrun"}


def task_routes() -> dict[str, dict[str, Any]]:
    """Celery's `task_routes`: each task's shared queue (a sender may still name a node queue)."""
    return {name: {"queue": queue} for name, queue in STAGE_QUEUE.items()}


def node_queue(stage: str, node: str) -> str:
    return f"{stage}@{node}"


def worker_queues(stage: str, node: str) -> list[str]:
    """What a pool of `stage` on `node` consumes."""
    return [stage] if stage not in NODE_BOUND else [stage, node_queue(stage, node)]


def queue_for(store: PipelineStore, name: str, arg: str) -> str:
    """The queue of stage task `name` for session `arg` (callbacks: the shared postrun)."""
    stage = STAGE_QUEUE.get(name, "postrun")
    if name not in (RUN_TASK, POSTRUN_TASK):
        return stage
    rec = store.known_session(arg)  # the record the sending stage just wrote
    host = rec.runtime_host if rec else None
    if host is None:
        return stage
    if name == POSTRUN_TASK and not store.node_alive(host, max_age=1.0):
        return stage
    return node_queue(stage, host)


def make_enqueue(send: Callable[..., object], store: PipelineStore) -> Callable[[str, str], None]:
    """enqueue(task name, session id) over `send(name, args=[...], queue=...)` (Celery send_task)."""
    def enqueue(name: str, arg: str) -> None:
        lvl = task_level(store, arg) if name in (INIT_TASK, RUN_TASK) else 0
        if lvl:  # dispatch_priority: a higher task's init and run are taken first (priority.py)
            send(name, args=[arg], queue=queue_for(store, name, arg), priority=lvl)
        else:
            send(name, args=[arg], queue=queue_for(store, name, arg))
    return enqueue
