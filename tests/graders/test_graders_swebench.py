"""The swebench grader on a small real repository made here: a bug, FAIL_TO_PASS / PASS_TO_PASS
tests, an eval script printing swebench's log markers. Needs swebench==5.0.2 (the optional extra
`polar_mq[swebench]`); skipped without it."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tests.support.grading import FAIL_TO_PASS, FIX, PARTIAL, PASS_TO_PASS, Session, git, instance, make_repo
from polar_mq.graders import load_grader
from polar_mq.graders.run import run_grading
from polar_mq.graders.swebench import swebench_available
from polar_mq.model import Trajectory

pytestmark = pytest.mark.skipif(swebench_available() != "5.0.2",
                                reason="needs swebench==5.0.2: pip install 'polar_mq[swebench]'")

TRAJ = Trajectory(session_id="s1", task_id="t1", status="COMPLETED")


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> tuple[Path, str]:
    repo = tmp_path_factory.mktemp("src") / "calc"
    return repo, make_repo(repo)


def grade(session: Session, src: Path, base: str, **cfg):
    config = {"instance": instance(base), "repo_dir": "repo", "repo_source": str(src), **cfg}
    return load_grader("swebench", config).grade(TRAJ, session.context())


def test_correct_patch_resolves(tmp_path, source):
    src, base = source
    s = Session(tmp_path, src)
    s.edit("calc/__init__.py", *FIX)
    # caches and binaries never enter the patch
    s.write("calc/__pycache__/junk.cpython-311.pyc", "x")
    (s.repo / "blob.bin").write_bytes(b"\x00\x01\x02binary")
    g = grade(s, src, base)
    assert g.status == "ok" and g.reward == 1.0 and g.passed and g.details["resolved"]
    assert g.metadata["patch"]["files"] == ["calc/__init__.py"]
    assert g.metadata["patch"]["binaries_excluded"] == ["blob.bin"]
    assert g.metadata["patch"]["method"] == "git"
    assert g.tests == {t: "PASSED" for t in FAIL_TO_PASS + PASS_TO_PASS}
    ts = g.details["tests_status"]
    assert sorted(ts["FAIL_TO_PASS"]["success"]) == sorted(FAIL_TO_PASS) and not ts["PASS_TO_PASS"]["failure"]
    # the session's own git state is untouched (the diff used a throw-away index)
    assert git(s.repo, "status", "--porcelain", "--untracked-files=no") == "M calc/__init__.py"
    assert git(s.repo, "diff", "--cached") == ""


def test_partial_patch_does_not_resolve(tmp_path, source):
    src, base = source
    s = Session(tmp_path, src)
    s.edit("calc/__init__.py", *PARTIAL)
    g = grade(s, src, base)
    assert g.reward == 0.0 and not g.passed and not g.details["resolved"]
    ts = g.details["tests_status"]
    assert ts["FAIL_TO_PASS"]["failure"] == ["tests/test_calc.py::test_mul"]
    assert ts["FAIL_TO_PASS"]["success"] == ["tests/test_calc.py::test_mul_zero"]
    assert g.tests["tests/test_calc.py::test_mul"] == "FAILED"


def test_breaking_pass_to_pass_does_not_resolve(tmp_path, source):
    src, base = source
    s = Session(tmp_path, src)
    s.edit("calc/__init__.py", *FIX)
    s.edit("calc/__init__.py", "return a - b", "return b - a")
    g = grade(s, src, base)
    assert g.reward == 0.0 and not g.details["resolved"]
    ts = g.details["tests_status"]
    assert sorted(ts["FAIL_TO_PASS"]["success"]) == sorted(FAIL_TO_PASS)
    assert ts["PASS_TO_PASS"]["failure"] == ["tests/test_calc.py::test_sub"]


def test_empty_diff_scores_zero_without_running_tests(tmp_path, source):
    src, base = source
    s = Session(tmp_path, src)
    s.write("calc/__pycache__/x.pyc", "cache only")
    g = grade(s, src, base)
    assert g.reward == 0.0 and g.details["empty_patch"] and not g.passed
    assert not (s.dir / "grade").exists()  # no fresh runtime was started
    assert not list((s.dir / "logs" / "grader").glob("*eval*"))


CONFTEST = ("import pytest\n\n@pytest.hookimpl(hookwrapper=True)\n"
            "def pytest_runtest_makereport(item, call):\n"
            "    out = yield\n    out.get_result().outcome = 'passed'\n")


def test_patch_that_edits_tests_does_not_resolve(tmp_path, source):
    src, base = source
    s = Session(tmp_path, src)
    s.edit("calc/__init__.py", *PARTIAL)
    s.edit("tests/test_calc.py", "assert mul(3, 4) == 12", "assert mul(3, 4) == 7")
    # by default the test files the instance names, and their test directory, come from the base commit
    g = grade(s, src, base)
    assert g.reward == 0.0 and not g.details["resolved"]
    assert g.metadata["patch_touches_tests"] == ["tests/test_calc.py"]
    assert g.metadata["excluded_from_patch"] == ["tests/test_calc.py"] and g.metadata["test_dirs"] == ["tests"]
    assert g.tests["tests/test_calc.py::test_mul"] == "FAILED"
    # a patch of nothing but tests: nothing left to apply, 0 without running them
    s2 = Session(tmp_path, src, "s2")
    s2.edit("tests/test_calc.py", "assert mul(3, 4) == 12", "assert mul(3, 4) == 7")
    s2.write("tests/conftest.py", CONFTEST)
    g = grade(s2, src, base)
    assert g.reward == 0.0 and g.details["empty_patch"] and not g.tests
    assert g.metadata["excluded_from_patch"] == ["tests/conftest.py", "tests/test_calc.py"]


# Ways a patch can make every test pass without fixing anything: a conftest.py next to the tests
# or at the root, or pytest options in any of its config files loading a plugin the patch adds
# as ordinary source (calc/hack.py, which the grader keeps: inert without the config).
HACKS = {
    "tests/conftest.py": {"tests/conftest.py": CONFTEST},
    "conftest.py": {"conftest.py": CONFTEST},
    "pytest.ini": {"pytest.ini": "[pytest]\naddopts = -p calc.hack\n", "calc/hack.py": CONFTEST},
    "pyproject.toml": {"pyproject.toml": '[tool.pytest.ini_options]\naddopts = "-p calc.hack"\n',
                       "calc/hack.py": CONFTEST},
    "setup.cfg": {"setup.cfg": "[metadata]\nname = calc\n\n[tool:pytest]\naddopts = -p calc.hack\n",
                  "calc/hack.py": CONFTEST},
    "tox.ini": {"tox.ini": "[pytest]\naddopts = -p calc.hack\n", "calc/hack.py": CONFTEST},
}


@pytest.mark.parametrize("hack", sorted(HACKS))
def test_patch_forcing_tests_to_pass_does_not_resolve(tmp_path, source, hack):
    src, base = source
    s = Session(tmp_path, src)
    s.edit("calc/__init__.py", *PARTIAL)
    for rel, text in HACKS[hack].items():
        s.write(rel, text)
    cmd = f"{sys.executable} -m pytest -rA -p no:cacheprovider tests"
    # the hack works where it is not guarded: the live runtime says everything passes
    live = load_grader("test_runner", {"command": cmd, "repo_dir": "repo"}).grade(TRAJ, s.context())
    assert live.reward == 1.0 and live.tests["tests/test_calc.py::test_mul"] == "PASSED"
    g = grade(s, src, base)
    assert g.reward == 0.0 and not g.details["resolved"] and not g.passed
    assert g.metadata["excluded_from_patch"] == [hack]
    assert g.tests["tests/test_calc.py::test_mul"] == "FAILED"
    assert g.tests["tests/test_calc.py::test_mul_zero"] == "PASSED"  # the rest of the patch was applied
    # test_runner in a fresh runtime: the same, with no test_files configured
    fresh = load_grader("test_runner", {"command": cmd, "repo_dir": "repo", "fresh": True, "repo_source": str(src),
                                        "base_commit": base}).grade(TRAJ, s.context())
    assert fresh.reward == 0.0 and fresh.metadata["excluded_from_patch"] == [hack]
    assert fresh.tests["tests/test_calc.py::test_mul"] == "FAILED"
    if hack == "conftest.py":  # the opt-out, for tasks whose agents are meant to write test config
        g = grade(s, src, base, exclude_test_config=False)
        assert g.reward == 1.0 and g.metadata["excluded_from_patch"] == []


def test_legitimate_fix_with_other_files_resolves(tmp_path, source):
    """A real fix spread over several non-test files is applied whole; a conftest.py elsewhere
    (docs/) is dropped and listed, and that does not cost the fix anything."""
    src, base = source
    s = Session(tmp_path, src)
    s.edit("calc/__init__.py", "return a + b  # BUG", "return _mul(a, b)")
    s.edit("calc/__init__.py", "def add(a, b):", "from calc.helpers import _mul\n\n\ndef add(a, b):")
    s.write("calc/helpers.py", "def _mul(a, b):\n    return a * b\n")
    s.write("README.md", "calc: now multiplies\n")
    s.write("docs/conftest.py", "collect_ignore = ['build']\n")
    g = grade(s, src, base)
    assert g.reward == 1.0 and g.passed and g.details["resolved"]
    assert sorted(g.metadata["patch"]["files"]) == ["README.md", "calc/__init__.py", "calc/helpers.py",
                                                    "docs/conftest.py"]
    assert g.metadata["excluded_from_patch"] == ["docs/conftest.py"]
    assert g.metadata["patch_touches_test_config"] == ["docs/conftest.py"]
    assert "patch_touches_tests" not in g.metadata


def test_swe_gym_shape_eval_command_and_test_patch(tmp_path, source):
    """An instance without eval_script (SWE-Gym rows): the grader builds the script from
    eval_command, restoring the test files and applying test_patch."""
    src, base = source
    work = tmp_path / "mk"
    shutil.copytree(src, work)
    with open(work / "tests" / "test_calc.py", "a") as fh:
        fh.write("\n\ndef test_mul_neg():\n    assert mul(-2, 3) == -6\n")
    test_patch = git(work, "diff") + "\n"
    inst = instance(base, test_patch=test_patch, FAIL_TO_PASS=FAIL_TO_PASS + ["tests/test_calc.py::test_mul_neg"])
    del inst["eval_script"], inst["log_parser"]
    cfg = {"instance": inst, "repo_dir": "repo", "repo_source": str(src),
           "eval_command": f"{sys.executable} -m pytest -rA -p no:cacheprovider tests"}
    s = Session(tmp_path, src)
    s.edit("calc/__init__.py", *FIX)
    g = load_grader("swebench", cfg).grade(TRAJ, s.context())
    assert g.reward == 1.0 and g.tests["tests/test_calc.py::test_mul_neg"] == "PASSED"
    s2 = Session(tmp_path, src, "s2")
    s2.edit("calc/__init__.py", *PARTIAL)
    g = load_grader("swebench", cfg).grade(TRAJ, s2.context())
    assert g.reward == 0.0 and "tests/test_calc.py::test_mul_neg" in g.details["tests_status"]["FAIL_TO_PASS"]["failure"]


def test_infrastructure_failures_are_errors(tmp_path, source, monkeypatch):
    src, base = source
    s = Session(tmp_path, src)
    s.edit("calc/__init__.py", *FIX)
    cfg = {"instance": instance(base), "repo_dir": "repo", "repo_source": str(src)}
    g = run_grading("swebench", {**cfg, "patch": "/nonexistent/patch",
                                 "instance": instance("HEAD")}, TRAJ, s.context())
    assert g.status == "ok"  # git apply worked: the missing fallback was never needed
    g = run_grading("swebench", {**cfg, "git": "/nonexistent/git"}, TRAJ, s.context())
    assert g.status == "error" and g.reward is None and "git" in g.details["error"]
    g = run_grading("swebench", {**cfg, "instance": instance("0" * 40)}, TRAJ, s.context())
    assert g.status == "error" and "base commit" in g.details["error"]
    monkeypatch.setitem(sys.modules, "swebench.harness.grading", None)
    g = run_grading("swebench", cfg, TRAJ, s.context())
    assert g.status == "error" and "swebench==5.0.2" in g.details["error"]


def test_eval_timeout_keeps_statuses(tmp_path, source):
    src, base = source
    s = Session(tmp_path, src)
    s.edit("calc/__init__.py", *FIX)
    slow = instance(base)
    slow["eval_script"] = slow["eval_script"].replace("-m pytest", "-c 'import time; time.sleep(60)' #")
    g = run_grading("swebench", {"instance": slow, "repo_dir": "repo", "repo_source": str(src),
                                 "timeout_seconds": 4}, TRAJ, s.context())
    assert g.status == "timeout" and g.reward == 0.0 and not g.passed

