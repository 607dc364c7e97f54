"""Test support for graders: a small real Python repository with a bug, and a grading context on
the `local` runtime (a session runtime holding a copy of the repository the "agent" edits)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from polar_mq.graders.base import GradeContext
from polar_mq.runtimes import get_runtime
from polar_mq.taskspec import RuntimeSpec

CALC = '''def add(a, b):
    return a + b


def sub(a, b):
    return a - b


def mul(a, b):
    return a + b  # BUG
'''

TESTS = '''from calc import add, mul, sub


def test_add():
    assert add(2, 3) == 5


def test_sub():
    assert sub(5, 3) == 2


def test_mul():
    assert mul(3, 4) == 12


def test_mul_zero():
    assert mul(5, 0) == 0
'''

FAIL_TO_PASS = ["tests/test_calc.py::test_mul", "tests/test_calc.py::test_mul_zero"]
PASS_TO_PASS = ["tests/test_calc.py::test_add", "tests/test_calc.py::test_sub"]

FIX = ("return a + b  # BUG", "return a * b")
PARTIAL = ("return a + b  # BUG", "return 0 if b == 0 else a + b")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def make_repo(path: Path) -> str:
    """The buggy repository as one commit; returns the base commit."""
    (path / "calc").mkdir(parents=True)
    (path / "calc" / "__init__.py").write_text(CALC)
    (path / "tests").mkdir()
    (path / "tests" / "test_calc.py").write_text(TESTS)
    (path / ".gitignore").write_text("__pycache__/\n")
    git(path, "init", "-q")
    git(path, "-c", "user.name=t", "-c", "user.email=t@t", "add", "-A")
    git(path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    return git(path, "rev-parse", "HEAD")


def eval_script(base: str) -> str:
    """A SWE-bench-shaped eval script: reset the tests, run them between the log markers."""
    return "\n".join([
        "#!/bin/bash", "set -uxo pipefail",
        f"git checkout {base} -- tests",
        "echo '>>>>> Start Test Output'",
        f"{sys.executable} -m pytest -rA -p no:cacheprovider tests",
        "echo '>>>>> End Test Output'",
        f"git checkout {base} -- tests",
    ]) + "\n"


def instance(base: str, **extra: Any) -> dict[str, Any]:
    return {"instance_id": "calc__calc-1", "repo": "local/calc", "base_commit": base, "version": "0.1",
            "FAIL_TO_PASS": FAIL_TO_PASS, "PASS_TO_PASS": PASS_TO_PASS, "eval_script": eval_script(base),
            "log_parser": "parse_log_pytest", "eval_type": "pass_and_fail", **extra}


class Session:
    """A session runtime (local backend) with the repository copied to `repo/` inside it."""

    def __init__(self, tmp: Path, source: Path, name: str = "s1", spec: RuntimeSpec | None = None):
        self.spec = spec or RuntimeSpec()
        self.runtime = get_runtime("local")
        self.dir = tmp / name
        self.handle = self.runtime.start(self.spec, self.dir, name)
        self.runtime.upload(self.handle, source, "repo")
        self.repo = Path(self.handle.workdir) / "repo"
        self.name = name

    def edit(self, rel: str, old: str, new: str) -> None:
        path = self.repo / rel
        text = path.read_text()
        assert old in text, (rel, old)
        path.write_text(text.replace(old, new))

    def write(self, rel: str, text: str) -> None:
        path = self.repo / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def context(self, **extra: Any) -> GradeContext:
        return GradeContext(session_id=self.name, task_id="t-" + self.name, runtime=self.handle,
                            runtime_spec=self.spec, session_dir=self.dir, **extra)
