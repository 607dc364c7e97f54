"""`swebench`: SWE-bench / SWE-Gym grading — the agent's diff, applied to a fresh runtime, judged
by the instance's eval script and swebench's own log parsers and report (pinned: swebench==5.0.2,
the optional extra `pip install polar_mq[swebench]`).

Steps: `git diff` of the repository in the session runtime against the base commit (caches and
binaries excluded) → empty diff: reward 0, no tests run → a fresh runtime from the same image
(`local` backend: a fresh copy of `repo_source`) → the patch without the files it may not change
(below) → `git apply`, else `patch --fuzz=5` → the test files and test directories are restored
from the base commit (the agent's edits of tests are never run) → the eval
script, whose output is delimited by `>>>>> Start Test Output` / `>>>>> End Test Output` →
`swebench.harness.grading.get_eval_report`. Resolved (reward 1.0) only when every FAIL_TO_PASS
test passes and every PASS_TO_PASS test stays green; per-test statuses are kept in `Grade.tests`
and the FAIL_TO_PASS / PASS_TO_PASS success/failure lists in `details["tests_status"]`.

What the agent's patch may not change (dropped before it is applied, listed in
`Grade.metadata["excluded_from_patch"]`; the rest of the patch is applied as it is):
  - files under the protected test paths (`test_files`, see below) and under their test
    directories: the outermost ancestor named test / tests / testing of each protected file
    (`pkg/tests/test_x.py` → all of `pkg/tests/`), so a conftest.py, helper or __init__.py the
    agent adds or edits there never exists in the fresh runtime;
  - test-configuration files anywhere in the repository: conftest.py, pytest.ini, .pytest.ini,
    pytest.toml, tox.ini, setup.cfg, pyproject.toml, sitecustomize.py, usercustomize.py, *.pth
    (whole files: pytest takes options such as `addopts = -p plugin` from them, and they declare
    plugins and entry points). `exclude_test_config: false` keeps them (only for tasks whose
    agents are meant to edit test configuration).
A patch left empty by this scores 0 without running the tests (`details["empty_patch"]`).

Config (`grader.config`):
  instance      the dataset row: instance_id, repo, base_commit, FAIL_TO_PASS, PASS_TO_PASS,
                test_patch, version, and (swebench 5 datasets) eval_script, log_parser, eval_type,
                image. SWE-Gym rows have the same fields. Any of these may also be given at the
                top level of the config, overriding the instance.
  eval_command  test command when the instance has no eval_script: the grader builds the script
                (restore test files, apply test_patch, markers, command, markers)
  repo_dir      the repository inside the runtime (default: the workdir; "/testbed" in SWE images)
  repo_source   host path of the pristine repository (`local` backend's fresh runtime)
  test_files    paths (files or directories) restored from the base commit before the eval; new
                files under them are deleted (default: the files test_patch touches and the
                `path.py` of `path.py::test` ids in FAIL_TO_PASS / PASS_TO_PASS); their test
                directories are guarded as above
  exclude_test_config  drop test-configuration files from the patch (default true)
  timeout       seconds for the eval script (capped by the grading budget)
  exclude, git, patch, rerun_prepare, keep_fresh: see workspace.py
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from polar_mq.model import Trajectory
from polar_mq.graders.base import Grade, GradeContext, Grader, InfraError
from polar_mq.graders.workspace import (GRADE_DIR, TEST_CONFIG, apply_patch, cleanup_scratch, extract_diff,
                                        fresh_workspace, guard_patch, patch_files, restore_dirs, restore_paths,
                                        session_workspace)

SWEBENCH_VERSION = "5.0.2"
START, END = ">>>>> Start Test Output", ">>>>> End Test Output"
INSTANCE_FIELDS = ("instance_id", "repo", "base_commit", "patch", "test_patch", "problem_statement",
                   "version", "FAIL_TO_PASS", "PASS_TO_PASS", "environment_setup_commit", "eval_script",
                   "log_parser", "eval_type", "image", "image_assets")
_KEYS = set(INSTANCE_FIELDS) | {"instance", "eval_command", "repo_dir", "repo_source", "test_files", "timeout",
                                "exclude", "git", "patch", "rerun_prepare", "keep_fresh",
                                "exclude_test_config"}


def swebench_available() -> str | None:
    """The installed swebench version, or None."""
    try:
        from importlib.metadata import PackageNotFoundError, version
        try:
            return version("swebench")
        except PackageNotFoundError:
            return None
    except Exception:  # pragma: no cover
        return None


def _import_swebench():
    try:
        from swebench.harness.grading import get_eval_report, get_logs_eval
        from swebench.harness.utils import make_test_spec
    except ImportError as exc:
        raise InfraError(f"the swebench grader needs swebench=={SWEBENCH_VERSION} "
                         f"(pip install 'polar_mq[swebench]'): {exc}") from exc
    return make_test_spec, get_logs_eval, get_eval_report


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return list(json.loads(value)) if value.strip() else []
    return list(value)


def default_test_files(inst: dict[str, Any]) -> list[str]:
    """Files restored from the base commit when `test_files` is not configured: those test_patch
    touches and the files named by FAIL_TO_PASS / PASS_TO_PASS ids (`path.py::test`)."""
    files = patch_files(inst.get("test_patch") or "")
    for test in list(inst.get("FAIL_TO_PASS") or []) + list(inst.get("PASS_TO_PASS") or []):
        path = test.split("::", 1)[0]
        if "::" in test and path.endswith(".py") and " " not in path:
            files.append(path)
    return list(dict.fromkeys(files))


def default_log_parser(repo: str) -> str:
    try:
        from swebench.harness.log_parsers import PARSER_REGISTRY
        from swebench.harness.log_parsers.python import MAP_REPO_TO_PARSER_PY
    except ImportError:
        return "parse_log_pytest"
    fn = MAP_REPO_TO_PARSER_PY.get(repo)
    if fn is not None and fn.__name__ in PARSER_REGISTRY:
        return fn.__name__
    return "parse_log_pytest"


class SWEBenchGrader(Grader):
    name = "swebench"

    def __init__(self, **config: Any):
        unknown = sorted(set(config) - _KEYS)
        if unknown:
            raise ValueError(f"grader 'swebench': unknown config {unknown} (allowed: {sorted(_KEYS)})")
        super().__init__(**config)
        inst = dict(config.get("instance") or {})
        inst.update({k: config[k] for k in INSTANCE_FIELDS if k in config})
        if not inst.get("eval_script") and not config.get("eval_command"):
            raise ValueError("grader 'swebench' needs instance.eval_script or config.eval_command")
        for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
            inst[key] = _as_list(inst.get(key))
        self.instance = inst

    def evaluate(self, trajectory: Trajectory, context: GradeContext) -> Grade:
        make_test_spec, get_logs_eval, get_eval_report = _import_swebench()
        cfg, inst = self.config, self.instance
        repo_dir = cfg.get("repo_dir") or "."
        base = inst.get("base_commit") or "HEAD"
        git = cfg.get("git") or "git"
        iid = inst.get("instance_id") or context.task_id or "instance"
        f2p, p2p = inst["FAIL_TO_PASS"], inst["PASS_TO_PASS"]
        meta: dict[str, Any] = {"instance_id": iid, "swebench": swebench_available()}

        live = session_workspace(context)
        patch, info = extract_diff(live, repo_dir, base, cfg.get("exclude") or (), git)
        meta["patch"] = info
        if not patch.strip():
            return Grade(0.0, {"resolved": False, "empty_patch": True, "FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p},
                         passed=False, metadata=meta)

        protected = list(cfg.get("test_files") or default_test_files(inst))
        touched = [f for f in info["files"] if any(f == p or f.startswith(p.rstrip("/") + "/") for p in protected)]
        if touched:
            meta["patch_touches_tests"] = touched  # restored below: never run the agent's tests
        config_files = [f for f in info["files"] if TEST_CONFIG.search(f) and f not in touched]
        if config_files:
            meta["patch_touches_test_config"] = config_files
        kept, excluded, guards = guard_patch(patch, protected, cfg.get("exclude_test_config", True))
        meta["excluded_from_patch"] = excluded
        meta["test_dirs"] = guards
        if not kept.strip():  # nothing left but tests / test configuration
            return Grade(0.0, {"resolved": False, "empty_patch": True, "FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p},
                         passed=False, metadata=meta)

        with fresh_workspace(context, cfg) as ws:
            applied = apply_patch(ws, kept, repo_dir, git, cfg.get("patch") or "patch")
            meta["patch"].update(applied=applied["applied"], method=applied["method"])
            if not applied["applied"]:
                cleanup_scratch(ws)
                return Grade(0.0, {"resolved": False, "patch_apply_failed": True,
                                   "apply_output": applied["output"][-1000:]}, passed=False, metadata=meta)
            restore_paths(ws, list(dict.fromkeys(protected + [e for e in excluded if not e.startswith("<")])),
                          repo_dir, base, git)
            restore_dirs(ws, guards, repo_dir, base, git)
            spec_row = self._spec_row(iid, context, base, protected)
            spec = make_test_spec(spec_row)
            ws.upload_text(spec.eval_script, f"{GRADE_DIR}/eval.sh")
            result = ws.run(f'W="$PWD"; cd -- {shlex.quote(repo_dir)} || exit 95\nbash "$W/{GRADE_DIR}/eval.sh"',
                            "eval", timeout=cfg.get("timeout"), check_budget=False)
            cleanup_scratch(ws)
        meta.update({"log": result.log_path, "duration_s": round(result.duration_s, 3),
                     "eval_exit_code": result.exit_code})
        log_path = result.log_path
        try:
            statuses, found = get_logs_eval(spec, log_path)
        except Exception:
            statuses, found = {}, False
        if result.timed_out:
            grade = Grade.timeout(f"eval script did not finish within the grading budget "
                                  f"({result.duration_s:.0f} s)", reward=0.0, resolved=False)
            grade.tests, grade.metadata = dict(statuses), meta
            return grade
        report = get_eval_report(spec, {"instance_id": iid, "model_name_or_path": "polar_mq",
                                        "model_patch": kept}, log_path, include_tests_status=True)[iid]
        if not found and report.get("infra_failure"):
            return Grade.error(f"eval environment failure: {report.get('infra_failure_reason')}",
                               report=report)
        resolved = bool(report.get("resolved"))
        details = {"resolved": resolved, "patch_successfully_applied": report.get("patch_successfully_applied"),
                   "tests_status": report.get("tests_status"), "FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p}
        if not found:
            details["unparseable_log"] = True
        return Grade(1.0 if resolved else 0.0, details, tests=dict(statuses), passed=resolved, metadata=meta)

    def _spec_row(self, iid: str, context: GradeContext, base: str, protected: list[str]) -> dict[str, Any]:
        inst = self.instance
        row = {
            "instance_id": iid,
            "image": inst.get("image") or context.runtime_spec.image or "local",
            "repo": inst.get("repo") or "local/repo",
            "version": str(inst.get("version") or "0"),
            "FAIL_TO_PASS": inst["FAIL_TO_PASS"],
            "PASS_TO_PASS": inst["PASS_TO_PASS"],
            "log_parser": inst.get("log_parser") or default_log_parser(inst.get("repo") or ""),
            "eval_type": inst.get("eval_type") or "pass_and_fail",
            "eval_script": inst.get("eval_script") or self._build_eval_script(base, protected),
            "image_assets": inst.get("image_assets"),
        }
        return row

    def _build_eval_script(self, base: str, protected: list[str]) -> str:
        """An eval script in SWE-bench's shape for instances without one (SWE-Gym rows)."""
        git = shlex.quote(self.config.get("git") or "git")
        lines = ["#!/bin/bash", "set -uxo pipefail"]
        restore = ""
        if protected:
            files = " ".join(shlex.quote(p) for p in protected)
            restore = f"{git} checkout {shlex.quote(base)} -- {files} 2>/dev/null || true"
            lines.append(restore)
        test_patch = self.instance.get("test_patch") or ""
        if test_patch.strip():
            # as written: a patch whose last line is a blank context line (" ") is corrupt once stripped
            body = test_patch if test_patch.endswith("\n") else test_patch + "\n"
            lines.append(f"{git} apply -v - <<'EOF_POLAR_TEST_PATCH'\n{body}EOF_POLAR_TEST_PATCH")
        lines += [f"echo '{START}'", self.config["eval_command"], f"echo '{END}'"]
        if restore:
            lines.append(restore)
        return "\n".join(lines) + "\n"
