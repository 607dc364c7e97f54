"""Group-relative advantages and the "GRPO learns nothing from this group" test (pure functions).

Rewards of masked sessions (None: an infrastructure ERROR, no reward) take no part: their
advantage is None and they do not move the group's statistics.

- `mean_std` (GRPO): (r − mean) / (std + eps), eps 1e-4 and std with Bessel's correction (n − 1), as TRL's
  GRPOTrainer computes it per group; `scale=False` gives r − mean (Dr. GRPO).
- `leave_one_out` (RLOO): r_i − mean of the other rewards = n / (n − 1) · (r_i − mean).
A group with fewer than two rewards has advantage 0.0 for the one it has.
"""

from __future__ import annotations

import math
from typing import Sequence

METHODS = ("mean_std", "leave_one_out")
ALIASES = {"grpo": "mean_std", "rloo": "leave_one_out", "loo": "leave_one_out"}


def method_name(method: str) -> str:
    name = ALIASES.get(method, method)
    if name not in METHODS:
        raise ValueError(f"unknown advantage method {method!r}; use one of {', '.join(METHODS)}")
    return name


def group_advantages(rewards: Sequence[float | None], method: str = "mean_std", *, eps: float = 1e-4,
                     scale: bool = True) -> list[float | None]:
    name = method_name(method)
    values = [float(r) for r in rewards if r is not None]
    n = len(values)
    if n < 2:
        return [None if r is None else 0.0 for r in rewards]
    mean = sum(values) / n
    if name == "leave_one_out":
        factor = n / (n - 1)
        return [None if r is None else factor * (float(r) - mean) for r in rewards]
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    denom = (std + eps) if scale else 1.0
    return [None if r is None else (float(r) - mean) / denom for r in rewards]


def unusable_reason(states: Sequence[str], rewards: Sequence[float | None], *,
                    drop_uniform_reward: bool = False, tolerance: float = 1e-9) -> str | None:
    """Why a group gives GRPO nothing to learn from, or None when it is usable: every session
    ERROR ("all_error"), fewer than two rewarded sessions ("too_few_rewards"), or — when asked —
    every reward the same ("uniform_reward": zero advantage everywhere)."""
    if not states or all(s == "ERROR" for s in states):
        return "all_error"
    values = [r for r in rewards if r is not None]
    if drop_uniform_reward:
        if len(values) < 2:
            return "too_few_rewards"
        if max(values) - min(values) <= tolerance:
            return "uniform_reward"
    return None
