"""How a session's reward reaches its traces (builder config ``reward_scope``, CONTRACT "Agent
lineage and versions per token"):

- ``session`` (default): every trace gets the session's reward;
- ``split``: the reward divided equally across the traces (they sum to the session's reward);
- ``root``: only the top-level agent's traces (those without ``metadata.spawned_by``: its root
  chains, their retries, forks and compaction continuations) get it; sub-agents' traces get 0.0.
A session without a reward (None) leaves every trace's reward None. Guarded by
tests/merge/test_merge_lineage.py::test_reward_scopes.
"""

from __future__ import annotations

from polar_mq.model import Trajectory

SCOPES = ("session", "split", "root")


def assign_rewards(traj: Trajectory, scope: str | None = None) -> None:
    if scope is None:  # from the builder's stats; a custom builder's own value falls back
        scope = traj.stats.get("reward_scope")
        scope = scope if scope in SCOPES else "session"
    elif scope not in SCOPES:
        raise ValueError(f"reward_scope must be one of {', '.join(SCOPES)}, got {scope!r}")
    reward = traj.reward
    traces = traj.traces
    for trace in traces:
        if reward is None:
            trace.reward = None
        elif scope == "split":
            trace.reward = reward / len(traces)
        elif scope == "root" and trace.metadata.get("spawned_by") is not None:
            trace.reward = 0.0
        else:
            trace.reward = reward
