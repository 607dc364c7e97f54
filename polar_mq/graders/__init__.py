"""Graders turn a finished session into a reward. `grade(spec, trajectory)` picks one by name.

Only `completion` exists so far; the test-runner and SWE-bench graders and plug-ins follow.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from ..model import Trajectory


@dataclass
class Grade:
    reward: float | None
    details: dict[str, Any] = field(default_factory=dict)
    status: str = "ok"  # ok | error (infrastructure failure: trainers should mask it)


class CompletionGrader:
    """1.0 if the session COMPLETED, else 0.0."""

    def __init__(self, **config: Any):
        if config:
            raise ValueError(f"grader 'completion' takes no config, got {sorted(config)}")

    def grade(self, trajectory: Trajectory, context: dict[str, Any] | None = None) -> Grade:
        return Grade(1.0 if trajectory.status == "COMPLETED" else 0.0, {"status": trajectory.status})


_BUILTIN = {"completion": CompletionGrader}


def load_grader(strategy: str, config: dict[str, Any] | None = None):
    if strategy in _BUILTIN:
        return _BUILTIN[strategy](**(config or {}))
    if ":" in strategy:
        module, _, name = strategy.partition(":")
        return getattr(importlib.import_module(module), name)(**(config or {}))
    raise ValueError(f"unknown grader {strategy!r} (built in: {', '.join(_BUILTIN)}, or 'module:Class')")
