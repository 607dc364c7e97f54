"""`test_runner`: run a test command in the session's runtime (or a fresh one) and score its results.

Config (`grader.config`):
  command       (required) bash command; runs in `repo_dir`
  repo_dir      repository / working directory inside the runtime (default: the workdir)
  format        auto | pytest | lines | junit (auto: junit when `junit_xml` is set, else lines)
  junit_xml     report path (relative to repo_dir) the command writes; deleted before the run
  reward        binary (1.0 only if all pass) | fraction (share passed)        default binary
  expected      {test: PASSED|FAILED} or [tests that must pass]; only these are scored
  env           extra environment for the command
  timeout       seconds for the command (capped by the grading budget)
  fresh         true: grade in a fresh runtime with the agent's `git diff` applied, so edits the
                agent made outside the diff (caches, other state) are not trusted. Never applied
                from the diff (listed in `Grade.metadata["excluded_from_patch"]`): files under
                `test_files` and under their test directories (the outermost ancestor named
                test / tests / testing of each: `tests/test_x.py` guards all of `tests/`), and
                test-configuration files anywhere (conftest.py, pytest.ini, tox.ini, setup.cfg,
                pyproject.toml, sitecustomize.py, usercustomize.py, *.pth: see swebench.py)
  test_files    (fresh) paths restored from `base_commit` after the patch is applied
  exclude_test_config  (fresh) drop test-configuration files from the diff (default true; false
                for tasks whose agents are meant to write conftest.py / pytest config)
  base_commit, repo_source, rerun_prepare, keep_fresh, exclude, git, patch: see workspace.py
"""

from __future__ import annotations

import shlex
from typing import Any

from polar_mq.model import Trajectory
from polar_mq.graders import parsing
from polar_mq.graders.base import Grade, GradeContext, Grader, InfraError
from polar_mq.graders.workspace import (Workspace, apply_patch, cleanup_scratch, extract_diff, fresh_workspace,
                                        guard_patch, restore_dirs, restore_paths, session_workspace)

_KEYS = {"command", "repo_dir", "format", "junit_xml", "reward", "expected", "env", "timeout", "fresh",
         "test_files", "base_commit", "repo_source", "rerun_prepare", "keep_fresh", "exclude", "git", "patch",
         "exclude_test_config"}


class TestRunnerGrader(Grader):
    name = "test_runner"
    __test__ = False  # not a pytest test class

    def __init__(self, **config: Any):
        unknown = sorted(set(config) - _KEYS)
        if unknown:
            raise ValueError(f"grader 'test_runner': unknown config {unknown} (allowed: {sorted(_KEYS)})")
        if not config.get("command"):
            raise ValueError("grader 'test_runner' needs config.command")
        if config.get("reward", "binary") not in ("binary", "fraction"):
            raise ValueError("grader 'test_runner': reward must be 'binary' or 'fraction'")
        if config.get("format", "auto") not in ("auto", "pytest", "lines", "junit"):
            raise ValueError("grader 'test_runner': format must be auto, pytest, lines or junit")
        if config.get("format") == "junit" and not config.get("junit_xml"):
            raise ValueError("grader 'test_runner': format junit needs junit_xml")
        super().__init__(**config)

    def evaluate(self, trajectory: Trajectory, context: GradeContext) -> Grade:
        cfg = self.config
        if not cfg.get("fresh"):
            return self._run(session_workspace(context), context, {"runtime": "session"})
        live = session_workspace(context)
        repo_dir = cfg.get("repo_dir") or "."
        base = cfg.get("base_commit") or "HEAD"
        git = cfg.get("git") or "git"
        patch, info = extract_diff(live, repo_dir, base, cfg.get("exclude") or (), git)
        protected = list(cfg.get("test_files") or [])
        patch, excluded, guards = guard_patch(patch, protected, cfg.get("exclude_test_config", True))
        with fresh_workspace(context, cfg) as ws:
            meta: dict[str, Any] = {"runtime": "fresh", "patch": info, "excluded_from_patch": excluded,
                                    "test_dirs": guards}
            if patch.strip():
                applied = apply_patch(ws, patch, repo_dir, git, cfg.get("patch") or "patch")
                meta["patch"].update(applied=applied["applied"], method=applied["method"])
                if not applied["applied"]:
                    cleanup_scratch(ws)
                    return Grade(0.0, {"patch_apply_failed": True, "apply_output": applied["output"][-1000:]},
                                 passed=False, metadata=meta)
            restore_paths(ws, list(dict.fromkeys(protected + [e for e in excluded if not e.startswith("<")])),
                          repo_dir, base, git)
            restore_dirs(ws, guards, repo_dir, base, git)
            cleanup_scratch(ws)
            return self._run(ws, context, meta)

    def _run(self, ws: Workspace, context: GradeContext, meta: dict[str, Any]) -> Grade:
        cfg = self.config
        repo_dir = cfg.get("repo_dir") or "."
        junit = cfg.get("junit_xml")
        fmt = cfg.get("format", "auto")
        if fmt == "auto":
            fmt = "junit" if junit else "lines"
        pre = f"cd -- {shlex.quote(repo_dir)} || {{ echo __POLAR_NO_REPO__; exit 95; }}\n"
        if junit:
            pre += f"rm -f -- {shlex.quote(junit)}\n"  # never read a report the agent left behind
        result = ws.run(pre + cfg["command"], "tests", env=cfg.get("env") or {}, timeout=cfg.get("timeout"),
                        check_budget=False)
        output = ws.output(result)
        if result.exit_code == 95 and output.startswith("__POLAR_NO_REPO__"):
            raise InfraError(f"repo_dir {repo_dir!r} does not exist in the {meta['runtime']} runtime")
        statuses: dict[str, str] = {}
        summary = None
        if fmt == "junit":
            path = junit if repo_dir in (".", "") else f"{repo_dir.rstrip('/')}/{junit}"
            text = ws.download_text(path)
            if text:
                try:
                    statuses = parsing.parse_junit(text)
                except Exception as exc:
                    meta["junit_error"] = f"unreadable JUnit XML: {exc}"
            else:
                meta["junit_error"] = f"no JUnit report at {path}"
        else:
            statuses = parsing.parse_lines(output)
            summary = parsing.parse_summary(output)
        meta.update({"log": result.log_path, "duration_s": round(result.duration_s, 3)})
        if result.timed_out:
            grade = Grade.timeout(f"test command did not finish within the grading budget "
                                  f"({result.duration_s:.0f} s)", reward=0.0)
            grade.tests, grade.metadata = statuses, meta
            return grade
        reward, details = parsing.score(statuses, expected=cfg.get("expected"), mode=cfg.get("reward", "binary"),
                                        exit_code=result.exit_code, summary=summary)
        if meta.get("junit_error"):
            details["error"] = meta["junit_error"]
        return Grade(reward, details, tests=statuses, passed=reward >= 1.0, metadata=meta)
