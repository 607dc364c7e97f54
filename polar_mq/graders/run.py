"""Grading as the postrun stage does it: load, give the grader its budget, never raise.

`run_grading` returns a Grade in every case: a config that does not load or a grader that raises
is an infrastructure `error` (reward None); a grader still busy `grace` seconds after its budget
is a `timeout` (reward None; its commands were given the same deadline, so they are being killed);
the caller keeps the trajectory and its traces either way.

Tests: tests/graders/test_graders.py, tests/graders/test_graders_pipeline.py.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from polar_mq.model import Trajectory
from polar_mq.graders import grader_timeout, is_instant, load_grader, split_config
from polar_mq.graders.base import Grade, GradeContext

log = logging.getLogger("polar_mq.graders")

GRACE_S = 30.0


def run_grading(strategy: str, config: dict[str, Any] | None, trajectory: Trajectory,
                context: GradeContext | None = None, *, grace: float = GRACE_S) -> Grade:
    budget = grader_timeout(config)
    context = (context or GradeContext()).with_budget(budget)
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            grader = load_grader(strategy, config)
            if hasattr(grader, "timeout_seconds"):
                grader.timeout_seconds = budget
            box["grade"] = grader.grade(trajectory, context)
        except Exception as exc:  # a grader bug or bad config must not lose the session
            log.exception("grader %s failed for %s", strategy, trajectory.session_id)
            box["grade"] = Grade.error(f"grader {strategy!r} failed: {type(exc).__name__}: {exc}")

    if is_instant(strategy):  # no thread to start and join per session (bench/bench_dispatch.py)
        work()
        return _as_grade(box["grade"], strategy)
    thread = threading.Thread(target=work, name=f"grade-{trajectory.session_id}", daemon=True)
    thread.start()
    thread.join(budget + grace)
    if thread.is_alive():
        return Grade.timeout(f"grader {strategy!r} still running {budget + grace:.0f} s after it started "
                             f"(budget {budget:.0f} s)", reward=None)
    return _as_grade(box["grade"], strategy)


def _as_grade(grade: Any, strategy: str) -> Grade:
    if not isinstance(grade, Grade):  # a plug-in returning a bare number or dict
        if isinstance(grade, (int, float)):
            grade = Grade(float(grade))
        elif isinstance(grade, dict):
            grade = Grade(grade.get("reward"), grade.get("details") or {}, grade.get("status", "ok"))
        else:
            grade = Grade.error(f"grader {strategy!r} returned {type(grade).__name__}, not a Grade")
    return grade


def sft_options(config: dict[str, Any] | None) -> dict[str, Any] | None:
    """The offline-SFT options of a grader config, or None when the mode is off."""
    _, common = split_config(config)
    return common if common.get("keep_only_passing") else None
