"""The GRPO example's reward: polar_mq's test_runner grader running ``check_cursor.py`` in the
session's runtime, with the task's target direction (``metadata.target`` of the dataset row).

    grader: {strategy: "examples.grpo.grader:CursorGrader"}

A plug-in (``module:Class``) only because the expected answer differs per row; the scoring is the
test_runner's own (PASSED/FAILED lines, binary reward: 1.0 only when every check passes). The
postrun workers must be able to import ``examples.grpo`` (the demo starts them with the
repository on PYTHONPATH).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

from polar_mq.graders.base import Grade, GradeContext, InfraError
from polar_mq.graders.test_runner import TestRunnerGrader
from polar_mq.model import Trajectory

CHECK = Path(__file__).resolve().with_name("check_cursor.py")


class CursorGrader(TestRunnerGrader):
    name = "grpo_cursor"
    __test__ = False

    def __init__(self, **config: Any):
        config.setdefault("command", f"{shlex.quote(sys.executable)} {shlex.quote(str(CHECK))}")
        config.setdefault("format", "lines")
        super().__init__(**config)

    def evaluate(self, trajectory: Trajectory, context: GradeContext) -> Grade:
        target = (context.task.metadata if context.task is not None else {}).get("target")
        if not target:
            raise InfraError("task has no metadata.target (the direction the instruction names)")
        self.config = {**self.config, "env": {**(self.config.get("env") or {}), "TARGET": str(target)}}
        return super().evaluate(trajectory, context)


class AnswerGrader(CursorGrader):
    """The Codex task's reward: ``check_answer.py`` (``answer.txt`` names the row's direction),
    the test_runner's verdict, ``metadata.target`` as ``TARGET``."""

    name = "grpo_answer"
    __test__ = False

    def __init__(self, **config: Any):
        config.setdefault("command", f"{shlex.quote(sys.executable)} {shlex.quote(str(ANSWER_CHECK))}")
        super().__init__(**config)


ANSWER_CHECK = Path(__file__).resolve().with_name("check_answer.py")
