"""JSON views of tasks and sessions (pure functions: records in, dicts out).

Tests: tests/api/test_api.py, tests/pipeline/test_orphans.py.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any, Iterable

from polar_mq import states
from polar_mq.model import SessionRecord, Trajectory


def durations(rec: SessionRecord, now: float | None = None) -> dict[str, float]:
    """Seconds spent in each state so far (the current one counts up to now)."""
    now = now or time.time()
    out: dict[str, float] = {}
    for name, start in rec.timings.items():
        if not name.endswith("_start"):
            continue
        stage = name[: -len("_start")]
        end = rec.timings.get(f"{stage}_end")
        if end is None:
            if stage != rec.state.lower() or states.is_terminal(rec.state):
                continue
            end = now
        out[stage] = round(max(0.0, end - start), 3)
    return out


def session_summary(rec: SessionRecord, now: float | None = None) -> dict[str, Any]:
    summary = {
        "session_id": rec.session_id,
        "index": rec.index,
        "state": rec.state,
        "attempt": rec.attempt,
        "node": rec.node,
        "error": rec.error,
        "reward": rec.reward,
        "outcome": rec.outcome,
        "exit_code": rec.exit_code,
        "created_at": rec.created_at,
        "updated_at": rec.updated_at,
        "deadline": rec.deadline,
        "timings": dict(rec.timings),
        "durations": durations(rec, now),
    }
    if rec.events:  # e.g. orphaned runtimes reaped for it (runtimes/orphans.py)
        summary["events"] = list(rec.events)
    return summary


def overall_state(records: Iterable[SessionRecord]) -> str:
    recs = list(records)
    if recs and all(states.is_terminal(r.state) for r in recs):
        return "done"
    if all(r.state == states.REGISTERED for r in recs):
        return "pending"
    return "running"


def counts(records: Iterable[SessionRecord]) -> dict[str, int]:
    c = Counter(r.state for r in records)
    ordered = [*states.ORDER, states.COMPLETED, states.ERROR, states.TIMEOUT]
    return {s: c[s] for s in ordered if c.get(s)} | {s: n for s, n in c.items() if s not in ordered}


def task_status(task_id: str, stored: dict[str, Any], records: list[SessionRecord], *,
                cancelled: bool, sessions: bool = True) -> dict[str, Any]:
    now = time.time()
    spec = stored.get("spec") or {}
    rewards = [r.reward for r in records if r.reward is not None]
    body: dict[str, Any] = {
        "task_id": task_id,
        "state": overall_state(records),
        "cancelled": cancelled,
        "created_at": stored.get("created_at"),
        "num_samples": spec.get("num_samples", len(records)),
        "harness": (spec.get("agent") or {}).get("harness"),
        "counts": counts(records),
        "terminal": sum(1 for r in records if states.is_terminal(r.state)),
        "mean_reward": (sum(rewards) / len(rewards)) if rewards else None,
    }
    if sessions:
        body["sessions"] = [session_summary(r, now) for r in records]
    return body


def parse_status_filter(value: str | None) -> set[str] | None:
    if not value:
        return None
    return {v.strip().upper() for v in value.split(",") if v.strip()}


def trajectory_matches(traj: Trajectory, status: set[str] | None, min_reward: float | None) -> bool:
    if status is not None and traj.status.upper() not in status:
        return False
    if min_reward is not None and (traj.reward is None or traj.reward < min_reward):
        return False
    return True
