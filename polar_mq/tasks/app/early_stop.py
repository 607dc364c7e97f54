"""Early stop: once `early_stop_min_usable_sessions` sessions of a task are graded without ERROR,
its other sessions are cancelled exactly as `DELETE /v1/tasks/<id>` cancels them.

The task's cancel flag is the one DELETE sets, written with the value `early_stop` (SET NX: a
user's cancel that came first stays a user cancel), so every stage stops those sessions the way
it stops a cancelled task: queued ones end at once (ERROR, "cancelled"), a running harness is
stopped by its cancel watch and its partial trajectory is built from the calls it made. Each
session that ends "cancelled" under this flag is labelled `metadata.early_stopped: true` and
counted in a per-task set the group (`GET /v1/groups/next`, `early_stopped`) reads.
Guarded by tests/pipeline/test_early_stop.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from polar_mq import states
from polar_mq.model import SessionRecord, Trajectory

if TYPE_CHECKING:
    from polar_mq.store.pipeline import PipelineStore

EARLY_STOP = b"early_stop"  # the cancel flag's value when early stop (not a user) set it
CANCELLED = "cancelled"  # the error DELETE gives a cancelled session


def stopped_key(store: PipelineStore, task_id: str) -> str:
    """Set of the task's session ids that early stop cancelled (expires with the task's keys)."""
    return f"{store.keys.prefix}:task:{task_id}:early_stopped"


def usable(records: Iterable[SessionRecord]) -> int:
    """Sessions graded without ERROR (COMPLETED or TIMEOUT: both carry a reward a trainer can use)."""
    return sum(1 for r in records if states.is_terminal(r.state) and r.state != states.ERROR)


def is_early_stop(store: PipelineStore, task_id: str) -> bool:
    return store.r.get(store.keys.task_cancelled(task_id)) == EARLY_STOP


def label(store: PipelineStore, traj: Trajectory, error: str | None) -> None:
    """Mark a trajectory cancelled by early stop (its partial calls are kept as built)."""
    if error != CANCELLED or not traj.task_id or not is_early_stop(store, traj.task_id):
        return
    traj.metadata["early_stopped"] = True
    store.r.sadd(stopped_key(store, traj.task_id), traj.session_id)


def stopped(store: PipelineStore, task_id: str) -> set[str]:
    return {m.decode() if isinstance(m, bytes) else str(m) for m in store.r.smembers(stopped_key(store, task_id))}


def view(store: PipelineStore, task_id: str) -> dict[str, Any]:
    """The task status' fields: `cancelled` (by a user) and `early_stopped` (how many sessions)."""
    flag = store.r.get(store.keys.task_cancelled(task_id))
    return {"cancelled": flag is not None and flag != EARLY_STOP,
            "early_stopped": int(store.r.scard(stopped_key(store, task_id)))}
