"""The grader interface: a finished session (trajectory + runtime context) → a `Grade`.

A grader is any object with `grade(trajectory, context) -> Grade`. The context the postrun stage
passes is a plain dict:

- `session`: the SessionRecord as a dict (`runtime` is the live runtime handle, `outcome`, ...)
- `task`: the TaskRequest as a dict (`runtime` is the RuntimeSpec used to start a fresh runtime)
- `session_dir`: the session's directory on the worker (logs go under `<session_dir>/logs/`)
- `deadline`: unix time by which grading must be finished (the grader's own time budget)

Three outcomes are kept apart so trainers can tell them from each other:

- `status="ok"`: the reward is the agent's (0.0 for an agent that failed the tests);
- `status="timeout"`: the grader's budget ran out (tests hung); reward 0.0 unless the grader
  could not say anything at all (then None); the trajectory and its traces are kept;
- `status="error"`: infrastructure failure (runtime could not start, tooling missing, package
  missing): reward None, the session ends ERROR, trainers should mask it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ..model import Trajectory

OK, ERROR, TIMEOUT = "ok", "error", "timeout"

DEFAULT_TIMEOUT = 900.0  # seconds of grading when the task sets no `grader.config.timeout_seconds`


@dataclass
class Grade:
    reward: float | None
    details: dict[str, Any] = field(default_factory=dict)
    status: str = OK  # ok | error | timeout (see the module docstring)
    tests: dict[str, str] = field(default_factory=dict)  # test name → PASSED | FAILED | ERROR | SKIPPED ...
    passed: bool | None = None  # did the agent solve it (swebench: resolved); None → reward >= 1.0
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == OK

    def is_passing(self, threshold: float = 1.0) -> bool:
        """What offline SFT keeps: explicit `passed`, else reward >= threshold; never an error."""
        if self.status == ERROR:
            return False
        if self.passed is not None:
            return bool(self.passed)
        return self.reward is not None and self.reward >= threshold

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def error(cls, message: str, **details: Any) -> "Grade":
        return cls(None, {"error": message, **details}, ERROR, passed=False)

    @classmethod
    def timeout(cls, message: str, reward: float | None = 0.0, **details: Any) -> "Grade":
        return cls(reward, {"timed_out": True, "error": message, **details}, TIMEOUT, passed=False)


class InfraError(Exception):
    """Grading could not be done for reasons that are not the agent's (→ Grade status error)."""


class GraderTimeout(Exception):
    """The grader's budget ran out while a command was running (→ Grade status timeout)."""


class Grader:
    """Optional base class: keeps the config and turns InfraError / GraderTimeout into Grades.

    Subclasses implement `evaluate(trajectory, context) -> Grade`."""

    name = "grader"
    timeout_seconds: float = DEFAULT_TIMEOUT  # load_grader sets it from `grader.config.timeout_seconds`

    def __init__(self, **config: Any):
        self.config = config

    def grade(self, trajectory: Trajectory, context: dict[str, Any] | None = None) -> Grade:
        context = dict(context or {})
        context.setdefault("deadline", time.time() + self.timeout_seconds)
        try:
            grade = self.evaluate(trajectory, context)
        except GraderTimeout as exc:
            return Grade.timeout(str(exc))
        except InfraError as exc:
            return Grade.error(str(exc))
        grade.metadata.setdefault("grader", self.name)
        return grade

    def evaluate(self, trajectory: Trajectory, context: dict[str, Any]) -> Grade:  # pragma: no cover
        raise NotImplementedError


def remaining(context: dict[str, Any], default: float = DEFAULT_TIMEOUT) -> float:
    """Seconds left in the grading budget (the context's `deadline`, else `default` from now)."""
    deadline = context.get("deadline")
    if deadline is None:
        context["deadline"] = deadline = time.time() + default
    return float(deadline) - time.time()
