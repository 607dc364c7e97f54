"""How a session ends for the outside: its callbacks, and the early end of one that never ran.

Apart from stages.py so that the rollout API can end queued sessions (DELETE /v1/tasks/<id>)
without importing the stages, which pull harnesses, runtimes and graders into the API process.
The stages call the same functions, so a cancelled queued session ends the same from either side.
"""

from __future__ import annotations

from typing import Any

from polar_mq import states
from polar_mq.tasks.app import early_stop
from polar_mq.model import SessionRecord, Trajectory
from polar_mq.taskspec import TaskRequest
from polar_mq.tasks.app.callbacks import message as callback_message
from polar_mq.tasks.app.routing import CALLBACK_TASK
from polar_mq.tasks.app.context import StageContext


def finish_early(ctx: StageContext, rec: SessionRecord, task: TaskRequest, outcome: str, error: str,
                 expect: set[str] | None = None) -> str:
    """End a session that never ran (cancelled while queued): an empty trajectory, callbacks."""
    new = ctx.store.transition(rec.session_id, outcome, node=ctx.node, error=error, outcome=outcome,
                               expect=expect)
    if new is None:
        return "skipped"
    traj = Trajectory(session_id=rec.session_id, task_id=rec.task_id, status=outcome,
                      builder=task.builder.strategy, error=error,
                      stats={"calls": 0, "traces": 0, "delivered_fraction": 0.0},
                      metadata={**task.metadata, "harness": task.agent.harness})
    early_stop.label(ctx.store, traj, error)
    ctx.store.save_trajectory(traj)
    send_callbacks(ctx, task, new, traj)
    return outcome.lower()


def session_summary(rec: SessionRecord) -> dict[str, Any]:
    return {"session_id": rec.session_id, "state": rec.state, "reward": rec.reward, "error": rec.error,
            "attempt": rec.attempt, "node": rec.node, "timings": rec.timings}


def send_callbacks(ctx: StageContext, task: TaskRequest, rec: SessionRecord, traj: Trajectory) -> None:
    """session.finished for this session; task.finished, once, when it was the task's last."""
    if not task.callback_url:
        return
    ctx.enqueue(CALLBACK_TASK, callback_message(task.callback_url, "session.finished", task.task_id, {
        "event": "session.finished", "task_id": task.task_id, **session_summary(rec),
        "trajectory": traj.to_dict()}, rec.session_id))
    sessions = ctx.store.get_sessions(ctx.store.session_ids(task.task_id))
    if sessions and all(states.is_terminal(s.state) for s in sessions) and ctx.store.mark_callback_sent(task.task_id):
        ctx.enqueue(CALLBACK_TASK, callback_message(task.callback_url, "task.finished", task.task_id, {
            "event": "task.finished", "task_id": task.task_id,
            "sessions": [session_summary(s) for s in sessions]}))


def stop_early(ctx: StageContext, task: TaskRequest, rec: SessionRecord) -> bool:
    """Called once a session's grade is stored and its state terminal: if the task now has enough
    usable sessions, stop the rest. True when this call stopped them (once per task)."""
    n = task.early_stop_min_usable_sessions
    if not n or rec.state == states.ERROR:
        return False
    store = ctx.store
    records = store.get_sessions(store.session_ids(task.task_id))
    if early_stop.usable(records) < n or all(states.is_terminal(r.state) for r in records):
        return False
    if not store.r.set(store.keys.task_cancelled(task.task_id), early_stop.EARLY_STOP, nx=True):
        return False  # already stopped, or cancelled by a user
    # As DELETE does: queued sessions end now; the stages stop the others on the cancel flag.
    for other in records:
        if other.state == states.REGISTERED:
            finish_early(ctx, other, task, states.ERROR, early_stop.CANCELLED, expect={states.REGISTERED})
    return True
