"""The grader interface: a finished session (trajectory + runtime context) → a `Grade`.

A grader is any object with `grade(trajectory, context) -> Grade`; `context` is a `GradeContext`
(the session's runtime handle, the task's runtime spec for a fresh runtime, the session dir for
logs, the grading deadline, and the full session record and task when the postrun stage grades).

Three outcomes are kept apart so trainers can tell them from each other:

- `status="ok"`: the reward is the agent's (0.0 for an agent that failed the tests);
- `status="timeout"`: the grader's budget ran out (tests hung); reward 0.0 unless the grader
  could not say anything at all (then None); the trajectory and its traces are kept;
- `status="error"`: infrastructure failure (runtime could not start, tooling missing, package
  missing): reward None, the session ends ERROR, trainers should mask it.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from polar_mq.model import RuntimeHandle, SessionRecord, Trajectory
from polar_mq.taskspec import RuntimeSpec, TaskRequest

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


@dataclass
class GradeContext:
    """What a grader may use besides the trajectory.

    Typed (not a dict of dicts) so every grader and helper reads the same named fields, and a
    grader run outside the pipeline (tests, offline re-grading) builds one from what it has:
    `GradeContext(runtime=handle, runtime_spec=spec)` is enough for the workspace helpers.
    """

    session_id: str = "grade"
    task_id: str | None = None
    runtime: RuntimeHandle | None = None  # the session's live runtime (None: it never started)
    runtime_spec: RuntimeSpec = field(default_factory=RuntimeSpec)  # the task's: for a fresh runtime
    session_dir: Path | None = None  # the session's directory on the worker (logs: <dir>/logs/grader)
    deadline: float | None = None  # unix time by which grading must be done (the grader's budget)
    session: SessionRecord | None = None  # the full record (outcome, stats...) when the pipeline grades
    task: TaskRequest | None = None  # the full task when the pipeline grades
    get_runtime: Callable[[str], Any] | None = None  # the runtime factory by backend (a test seam)
    scratch_dir: Path | None = None  # where logs go without a session dir (made on first use)
    # the gateway's session client when the pipeline grades (`create_session`, `calls`): a judge
    # model's own session (rubric.py); graders never import the pipeline for it (.importlinter)
    gateway: Any = None

    @classmethod
    def for_session(cls, session: SessionRecord, task: TaskRequest, session_dir: Path,
                    gateway: Any = None) -> GradeContext:
        """The context the postrun stage grades a session in."""
        return cls(session_id=session.session_id, task_id=session.task_id, runtime=session.runtime,
                   runtime_spec=task.runtime, session_dir=Path(session_dir), session=session, task=task,
                   gateway=gateway)

    def with_budget(self, seconds: float) -> GradeContext:
        """A copy whose deadline is `seconds` from now."""
        return dataclasses.replace(self, deadline=time.time() + seconds)

    def remaining(self, default: float = DEFAULT_TIMEOUT) -> float:
        """Seconds left in the grading budget (without a deadline: one is set, `default` from now)."""
        if self.deadline is None:
            self.deadline = time.time() + default
        return self.deadline - time.time()

    def log_dir(self, handle: RuntimeHandle | None = None) -> Path:
        """Where grader command logs go: the session dir's (or `handle`'s) logs/grader, else a
        scratch dir made once per context."""
        base = self.session_dir or (handle.session_dir if handle is not None and handle.session_dir else None)
        if base:
            return Path(base) / "logs" / "grader"
        if self.scratch_dir is None:
            self.scratch_dir = Path(tempfile.mkdtemp(prefix="polar-grade-"))
        return self.scratch_dir


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

    def grade(self, trajectory: Trajectory, context: GradeContext | None = None) -> Grade:
        context = dataclasses.replace(context) if context is not None else GradeContext()  # ours to set
        if context.deadline is None:
            context.deadline = time.time() + self.timeout_seconds
        try:
            grade = self.evaluate(trajectory, context)
        except GraderTimeout as exc:
            return Grade.timeout(str(exc))
        except InfraError as exc:
            return Grade.error(str(exc))
        grade.metadata.setdefault("grader", self.name)
        return grade

    def evaluate(self, trajectory: Trajectory, context: GradeContext) -> Grade:  # pragma: no cover
        raise NotImplementedError
