"""Which weights sampled what: copy a task's `metadata.policy_version` onto its trajectory and
every trace (contract), and show per trace the versions its calls were actually sampled with
(`CaptureRecord.policy_version`, stamped by the gateway), so a session that straddled a weight
sync is visible call by call. Pure function over the built trajectory and its records.

Tests: tests/gateway/test_pause.py, tests/rl/test_trainer_mappings.py.
"""

from __future__ import annotations

from typing import Any, Iterable

from polar_mq.model import CaptureRecord, Trajectory


def stamp_versions(traj: Trajectory, calls: Iterable[CaptureRecord | dict[str, Any]],
                   task_metadata: dict[str, Any]) -> None:
    records = [CaptureRecord.from_dict(c) if isinstance(c, dict) else c for c in calls]
    by_call = {c.call_id: c for c in records}
    version = task_metadata.get("policy_version")
    sampled_all: set[int] = set()
    for trace in traj.traces:
        if "policy_version" in task_metadata:
            trace.metadata["policy_version"] = version
        sampled = [by_call[cid].policy_version if cid in by_call else None for cid in trace.call_ids]
        trace.metadata["sampled_policy_versions"] = sampled
        sampled_all.update(v for v in sampled if v is not None)
    if "policy_version" in task_metadata:
        traj.metadata["policy_version"] = version
    traj.metadata["sampled_policy_versions"] = sorted(sampled_all)
    held = sum(c.held_ms for c in by_call.values()) / 1000.0
    traj.stats["held_seconds"] = round(held, 3)
