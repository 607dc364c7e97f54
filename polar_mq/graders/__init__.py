"""Graders turn a finished session into a reward: `load_grader(strategy, config).grade(traj, context)`.

Built in: `completion` (1.0 if the session COMPLETED), `test_runner` (run a test command, parse
pytest / JUnit / `PASSED|FAILED name` output), `swebench` (SWE-bench / SWE-Gym: the agent's diff on
a fresh runtime, the instance's eval script, swebench's report), `harbor` (a Harbor task's
tests/test.sh in a fresh container from the session's, its reward file), `rubric` (a judge model
through the gateway scores the trajectory against a rubric, per criterion). Others load by `module:Class`
or by name from the `polar_mq.graders` entry-point group:

    [options.entry_points]            # setup.cfg of a plug-in package
    polar_mq.graders =
        my_grader = my_pkg.graders:MyGrader

A grader is any class taking the config as keyword arguments with a
`grade(trajectory, context) -> Grade` method (see base.py for the GradeContext and the
ok / timeout / error statuses). Deriving from `Grader` adds the time budget and turns
`InfraError` / `GraderTimeout` into the right Grade.

Config keys every grader accepts (taken out before the grader sees its config):
  timeout_seconds   grading budget in seconds (default 900); commands are killed when it runs out,
                    the trajectory and its traces are kept
  keep_only_passing offline SFT mode: passing trajectories go to an SFT JSONL with counts (sft.py)
  pass_threshold    reward that counts as passing when the grade does not say (default 1.0)
  sft_path          where the SFT JSONL goes (default <results_dir>/<task_id>/sft.jsonl)
  sft_roles         trace roles exported (default all)
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

from polar_mq.model import Trajectory
from polar_mq._io.plugins import import_object
from polar_mq.graders.base import DEFAULT_TIMEOUT, ERROR, OK, TIMEOUT, Grade, GradeContext, Grader, GraderTimeout, InfraError

ENTRY_POINT_GROUP = "polar_mq.graders"
COMMON_KEYS = ("timeout_seconds", "keep_only_passing", "pass_threshold", "sft_path", "sft_roles")


class CompletionGrader(Grader):
    """1.0 if the session COMPLETED, else 0.0."""

    name = "completion"
    instant = True  # reads the trajectory only: graded in the caller's thread (graders/run.py)

    def __init__(self, **config: Any):
        if config:
            raise ValueError(f"grader 'completion' takes no config, got {sorted(config)}")
        super().__init__()

    def evaluate(self, trajectory: Trajectory, context: GradeContext) -> Grade:
        ok = trajectory.status == "COMPLETED"
        return Grade(1.0 if ok else 0.0, {"status": trajectory.status}, passed=ok)


_BUILTIN = {
    "completion": "polar_mq.graders:CompletionGrader",
    "test_runner": "polar_mq.graders.test_runner:TestRunnerGrader",
    "swebench": "polar_mq.graders.swebench:SWEBenchGrader",
    "swe_gym": "polar_mq.graders.swebench:SWEBenchGrader",
    "harbor": "polar_mq.graders.harbor:HarborGrader",
    "rubric": "polar_mq.graders.rubric:RubricGrader",
}
_REGISTERED: dict[str, Any] = {}


def register(name: str, cls: Any) -> None:
    """Register a grader class under a name (in this process)."""
    _REGISTERED[name] = cls


def _entry_point(name: str) -> Any | None:
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            return ep.load()
    return None


def available() -> list[str]:
    """Names that load without `module:Class`: built-ins, registered, installed entry points."""
    names = set(_BUILTIN) | set(_REGISTERED)
    names |= {ep.name for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}
    return sorted(names)


def resolve(strategy: str) -> Any:
    """The grader class for a strategy name."""
    if strategy in _REGISTERED:
        return _REGISTERED[strategy]
    if strategy in _BUILTIN:
        return import_object(_BUILTIN[strategy])
    if ":" in strategy:
        try:
            return import_object(strategy)
        except ValueError as exc:
            raise ValueError(f"grader {strategy!r} could not be loaded: {exc}") from exc
    cls = _entry_point(strategy)
    if cls is not None:
        return cls
    raise ValueError(f"unknown grader {strategy!r} (available: {', '.join(available())}, "
                     f"or 'module:Class')")


def is_instant(strategy: str) -> bool:
    """A built-in grader that only reads the trajectory (no runtime, commands or I/O), so it
    cannot hang and needs no budget thread: `completion`."""
    if strategy in _REGISTERED or strategy not in _BUILTIN:
        return False
    return bool(getattr(resolve(strategy), "instant", False))


def split_config(config: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the grader's own config, the common options in COMMON_KEYS)."""
    own = dict(config or {})
    common = {k: own.pop(k) for k in COMMON_KEYS if k in own}
    return own, common


def load_grader(strategy: str, config: dict[str, Any] | None = None):
    own, common = split_config(config)
    grader = resolve(strategy)(**own)
    if "timeout_seconds" in common and isinstance(grader, Grader):
        grader.timeout_seconds = float(common["timeout_seconds"])
    return grader


def grader_timeout(config: dict[str, Any] | None) -> float:
    """The grading budget in seconds (`timeout_seconds`; DEFAULT_TIMEOUT when unset or invalid)."""
    try:
        value = float((config or {}).get("timeout_seconds") or DEFAULT_TIMEOUT)
    except (TypeError, ValueError):
        return DEFAULT_TIMEOUT
    return value if value > 0 else DEFAULT_TIMEOUT


__all__ = ["COMMON_KEYS", "DEFAULT_TIMEOUT", "ENTRY_POINT_GROUP", "ERROR", "OK", "TIMEOUT", "CompletionGrader",
           "Grade", "GradeContext", "Grader", "GraderTimeout", "InfraError", "available", "grader_timeout", "is_instant", "load_grader",
           "register", "resolve", "split_config"]
