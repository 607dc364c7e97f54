"""Graders: registry (built-ins, module:Class, entry points), completion, test_runner on pytest /
JUnit / plain lines (binary and partial credit, expected maps, fresh runtime), time budget and
infrastructure errors, offline SFT recording."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from tests.support.grading import FIX, PARTIAL, Session, make_repo
from polar_mq.graders import Grade, GradeContext, Grader, available, load_grader, parsing, sft
from polar_mq.graders.run import run_grading, sft_options
from polar_mq.graders.workspace import apply_patch, session_workspace
from polar_mq.model import Trace, Trajectory
from polar_mq.runtimes import get_runtime

PY = sys.executable
TRAJ = Trajectory(session_id="s1", task_id="t1", status="COMPLETED")


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> tuple[Path, str]:
    repo = tmp_path_factory.mktemp("src") / "calc"
    return repo, make_repo(repo)


# --- registry ------------------------------------------------------------------------------------
def test_builtins_and_completion():
    assert {"completion", "test_runner", "swebench"} <= set(available())
    g = load_grader("completion")
    assert g.grade(TRAJ).reward == 1.0 and g.grade(TRAJ).passed
    assert load_grader("completion", {}).grade(Trajectory(session_id="x", status="TIMEOUT")).reward == 0.0
    # common options are taken out before the grader sees its config
    assert load_grader("completion", {"timeout_seconds": 5, "keep_only_passing": True}).timeout_seconds == 5
    with pytest.raises(ValueError, match="takes no config"):
        load_grader("completion", {"bogus": 1})
    with pytest.raises(ValueError, match="unknown grader"):
        load_grader("no_such_grader")
    with pytest.raises(ValueError, match="needs config.command"):
        load_grader("test_runner", {})


PLUGIN = '''
from polar_mq.graders import Grade


class LengthGrader:
    def __init__(self, scale=1.0):
        self.scale = scale

    def grade(self, trajectory, context=None):
        return Grade(self.scale * len(trajectory.traces), {"traces": len(trajectory.traces)})
'''


def test_custom_grader_by_module_class(tmp_path, monkeypatch):
    (tmp_path / "polar_plugin_mod.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    g = load_grader("polar_plugin_mod:LengthGrader", {"scale": 0.5})
    traj = Trajectory(session_id="s", traces=[Trace([1], [2], [1]), Trace([1], [3], [1])])
    assert g.grade(traj).reward == 1.0
    grade = run_grading("polar_plugin_mod:LengthGrader", {"scale": 2, "timeout_seconds": 5}, traj)
    assert grade.reward == 4.0 and grade.status == "ok"
    with pytest.raises(ValueError, match="could not be loaded"):
        load_grader("polar_plugin_mod:Missing")


def test_custom_grader_by_entry_point(tmp_path, monkeypatch):
    """A plug-in package found through the `polar_mq.graders` entry-point group: a dist-info on
    sys.path (what pip would install), nothing installed into the venv."""
    (tmp_path / "polar_ep_plugin.py").write_text(PLUGIN)
    dist = tmp_path / "polar_ep_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: polar-ep-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[polar_mq.graders]\ntrace_count = polar_ep_plugin:LengthGrader\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "trace_count" in available()
    traj = Trajectory(session_id="s", traces=[Trace([1], [2], [1])])
    assert load_grader("trace_count", {"scale": 3}).grade(traj).reward == 3.0
    # the same name through the stage's entry point
    assert run_grading("trace_count", {}, traj).reward == 1.0


# --- parsers -------------------------------------------------------------------------------------
PYTEST_V = """
tests/test_calc.py::test_add PASSED                                      [ 25%]
tests/test_calc.py::test_sub PASSED                                      [ 50%]
tests/test_calc.py::test_mul FAILED                                      [ 75%]
tests/test_calc.py::test_p[a-1] SKIPPED (nope)                          [100%]
=========================== short test summary info ============================
SKIPPED [1] tests/test_calc.py:9: nope
FAILED tests/test_calc.py::test_mul - assert 7 == 12
==================== 1 failed, 2 passed, 1 skipped in 0.03s ====================
"""


def test_parse_pytest_lines_and_summary():
    st = parsing.parse_lines(PYTEST_V)
    assert st == {"tests/test_calc.py::test_add": "PASSED", "tests/test_calc.py::test_sub": "PASSED",
                  "tests/test_calc.py::test_mul": "FAILED", "tests/test_calc.py::test_p[a-1]": "SKIPPED"}
    assert parsing.parse_summary(PYTEST_V) == {"failed": 1, "passed": 2, "skipped": 1}
    assert parsing.score(st, mode="fraction", exit_code=1)[0] == pytest.approx(2 / 3)
    assert parsing.score(st, mode="binary", exit_code=1)[0] == 0.0
    # expected map: names match across formats (pytest ids, junit dotted names, bare names)
    reward, details = parsing.score(st, expected={"test_add": "PASSED", "tests.test_calc.test_mul": "FAILED"},
                                    exit_code=1)
    assert reward == 1.0 and details["matched"] == 2
    # a crash after PASSED lines is not a pass
    assert parsing.score({"a": "PASSED"}, exit_code=2)[1]["untrusted_output"]
    # no per-test lines: the summary counts
    assert parsing.score({}, summary={"passed": 3, "failed": 1}, mode="fraction", exit_code=1)[0] == 0.75
    assert parsing.score({}, exit_code=0)[1]["no_tests"]


def test_parse_junit_and_unittest():
    xml = """<?xml version="1.0"?><testsuites><testsuite name="pytest">
      <testcase classname="tests.test_calc" name="test_add" time="0.001"/>
      <testcase classname="tests.test_calc" name="test_mul"><failure message="x">boom</failure></testcase>
      <testcase classname="tests.test_calc" name="test_err"><error message="y"/></testcase>
      <testcase classname="tests.test_calc" name="test_skip"><skipped type="pytest.skip"/></testcase>
      <testcase classname="tests.test_calc" name="test_xf"><skipped type="pytest.xfail"/></testcase>
    </testsuite></testsuites>"""
    assert parsing.parse_junit(xml) == {"tests.test_calc.test_add": "PASSED", "tests.test_calc.test_mul": "FAILED",
                                        "tests.test_calc.test_err": "ERROR", "tests.test_calc.test_skip": "SKIPPED",
                                        "tests.test_calc.test_xf": "XFAIL"}
    ut = "test_a (pkg.test_m.T.test_a) ... ok\ntest_b (pkg.test_m.T.test_b) ... FAIL\n"
    assert parsing.parse_lines(ut) == {"pkg.test_m.T.test_a": "PASSED", "pkg.test_m.T.test_b": "FAILED"}


# --- test_runner on a real repository --------------------------------------------------------------
def test_runner_pytest_binary_and_fraction(tmp_path, source):
    src, _ = source
    fixed = Session(tmp_path, src, "fixed")
    fixed.edit("calc/__init__.py", *FIX)
    partial = Session(tmp_path, src, "partial")
    partial.edit("calc/__init__.py", *PARTIAL)
    cmd = f"{PY} -m pytest -v -p no:cacheprovider tests"
    g = load_grader("test_runner", {"command": cmd, "repo_dir": "repo"})
    good = g.grade(TRAJ, fixed.context())
    assert good.status == "ok" and good.reward == 1.0 and good.passed
    assert good.tests["tests/test_calc.py::test_mul"] == "PASSED" and len(good.tests) == 4
    bad = g.grade(TRAJ, partial.context())
    assert bad.reward == 0.0 and not bad.passed
    assert bad.tests["tests/test_calc.py::test_mul"] == "FAILED"
    assert bad.tests["tests/test_calc.py::test_mul_zero"] == "PASSED"
    frac = load_grader("test_runner", {"command": cmd, "repo_dir": "repo", "reward": "fraction"})
    assert frac.grade(TRAJ, partial.context()).reward == 0.75
    # only the listed tests count
    exp = load_grader("test_runner", {"command": cmd, "repo_dir": "repo",
                                      "expected": ["tests/test_calc.py::test_mul_zero", "test_add"]})
    assert exp.grade(TRAJ, partial.context()).reward == 1.0
    # a log of each run is kept under the session directory
    assert any((fixed.dir / "logs" / "grader").iterdir())


def test_runner_junit(tmp_path, source):
    src, _ = source
    partial = Session(tmp_path, src, "partial")
    partial.edit("calc/__init__.py", *PARTIAL)
    # a stale report the agent left behind must not be read
    partial.write("report.xml", '<testsuite><testcase classname="x" name="y"/></testsuite>')
    cfg = {"command": f"{PY} -m pytest -q -p no:cacheprovider --junitxml=report.xml tests",
           "repo_dir": "repo", "junit_xml": "report.xml"}
    g = load_grader("test_runner", {**cfg, "reward": "fraction"}).grade(TRAJ, partial.context())
    assert g.reward == 0.75 and g.tests["tests.test_calc.test_mul"] == "FAILED" and "x.y" not in g.tests
    g = load_grader("test_runner", {**cfg, "expected": {"tests/test_calc.py::test_mul": "FAILED",
                                                        "tests/test_calc.py::test_add": "PASSED"}})
    assert g.grade(TRAJ, partial.context()).reward == 1.0
    missing = load_grader("test_runner", {"command": "true", "repo_dir": "repo", "junit_xml": "none.xml"})
    g = missing.grade(TRAJ, partial.context())
    assert g.reward == 0.0 and "no JUnit report" in g.details["error"]


def test_runner_plain_lines(tmp_path, source):
    src, _ = source
    s = Session(tmp_path, src)
    lines = "printf 'PASSED alpha\\nFAILED beta\\nPASSED gamma\\nFAILED delta\\n'; exit 1"
    g = load_grader("test_runner", {"command": lines, "reward": "fraction"}).grade(TRAJ, s.context())
    assert g.reward == 0.5 and g.tests == {"alpha": "PASSED", "beta": "FAILED", "gamma": "PASSED", "delta": "FAILED"}
    exp = {"alpha": "PASSED", "beta": "FAILED", "gamma": "PASSED", "delta": "PASSED"}
    assert load_grader("test_runner", {"command": lines, "expected": exp, "reward": "fraction"}
                       ).grade(TRAJ, s.context()).reward == 0.75
    # PASSED lines from a command that then fails are not trusted
    g = load_grader("test_runner", {"command": "echo 'PASSED fake'; exit 3"}).grade(TRAJ, s.context())
    assert g.reward == 0.0 and g.details["untrusted_output"]


def test_runner_fresh_runtime_ignores_edited_tests(tmp_path, source):
    """The agent 'passes' by rewriting the test; in the live runtime that works, in a fresh
    runtime with the tests restored from the base commit it does not."""
    src, base = source
    s = Session(tmp_path, src)
    s.edit("tests/test_calc.py", "assert mul(3, 4) == 12", "assert mul(3, 4) == 7")
    s.edit("tests/test_calc.py", "assert mul(5, 0) == 0", "assert mul(5, 0) == 5")
    cfg = {"command": f"{PY} -m pytest -rA -p no:cacheprovider tests", "repo_dir": "repo"}
    assert load_grader("test_runner", cfg).grade(TRAJ, s.context()).reward == 1.0
    fresh = {**cfg, "fresh": True, "repo_source": str(src), "base_commit": base, "test_files": ["tests"]}
    g = load_grader("test_runner", fresh).grade(TRAJ, s.context())
    assert g.reward == 0.0 and g.metadata["runtime"] == "fresh"
    assert g.metadata["excluded_from_patch"] == ["tests/test_calc.py"]  # nothing of the patch was applied
    assert g.tests["tests/test_calc.py::test_mul"] == "FAILED"
    # and a real fix passes in the fresh runtime; the fresh copy is removed afterwards
    s2 = Session(tmp_path, src, "s2")
    s2.edit("calc/__init__.py", *FIX)
    g = load_grader("test_runner", fresh).grade(TRAJ, s2.context())
    assert g.reward == 1.0 and g.metadata["patch"]["files"] == ["calc/__init__.py"]
    assert not any((s2.dir / "grade").glob("fresh-*/work/repo"))


def test_guard_patch_splits_and_excludes():
    from polar_mq.graders.workspace import guard_patch, patch_files, split_patch, test_dirs

    def new(path, quoted=None):
        q = quoted or path
        a, b = (f'"a/{q[1:-1]}"', f'"b/{q[1:-1]}"') if quoted else (f"a/{q}", f"b/{q}")
        return f"diff --git {a} {b}\nnew file mode 100644\n--- /dev/null\n+++ {b}\n@@ -0,0 +1 @@\n+x\n"

    paths = ["calc/__init__.py", "sympy/core/tests/helper.py", "sympy/core/basic.py", "tests/a/b/data.json",
             "docs/conftest.py", "setup.cfg", "pkg/pyproject.toml", "site/x.pth", "sitecustomize.py",
             "usercustomize.py", ".pytest.ini", "pytest.toml", "tox.ini", "pkg/test_mod.py", "my tests/conftest.py"]
    patch = "".join(new(p) for p in paths) + new('q"x.py', '"q\\"x.py"')
    assert patch_files(patch) == paths + ['q"x.py']
    assert [p for p, _ in split_patch(patch)] == paths + ['q"x.py']
    protected = ["sympy/core/tests/test_basic.py", "tests/a/b/test_x.py", "pkg/test_mod.py", "test_root.py"]
    assert test_dirs(protected) == ["sympy/core/tests", "tests"]
    kept, excluded, guards = guard_patch(patch, protected)
    assert guards == ["sympy/core/tests", "tests"]
    assert patch_files(kept) == ["calc/__init__.py", "sympy/core/basic.py", 'q"x.py']
    assert excluded == [p for p in paths if p not in ("calc/__init__.py", "sympy/core/basic.py")]
    # without test-config exclusion only the protected paths and test directories are dropped
    kept, excluded, _ = guard_patch(patch, protected, exclude_test_config=False)
    assert excluded == ["sympy/core/tests/helper.py", "tests/a/b/data.json", "pkg/test_mod.py"]
    # a part whose path cannot be read is not trusted
    kept, excluded, _ = guard_patch("diff --git garbage\n@@ -1 +1 @@\n-a\n+b\n" + new("ok.py"), [])
    assert patch_files(kept) == ["ok.py"] and excluded == ["<unreadable diff header>"]


def test_patch_fuzz_fallback(tmp_path, source):
    src, _ = source
    s = Session(tmp_path, src)
    ws = session_workspace(s.context())
    # the first context line is off (the function was renamed): git apply refuses, patch --fuzz applies
    patch = ("--- a/calc/__init__.py\n+++ b/calc/__init__.py\n@@ -5,5 +5,5 @@\n def subtract(a, b):\n"
             "-    return a - b\n+    return -(b - a)\n \n \n def mul(a, b):\n")
    out = apply_patch(ws, patch, "repo")
    assert out["applied"] and out["method"] == "patch"
    assert "return -(b - a)" in (s.repo / "calc" / "__init__.py").read_text()
    out = apply_patch(ws, "--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-x\n+y\n", "repo")
    assert not out["applied"]


# --- budget and infrastructure failures -----------------------------------------------------------
def test_grader_timeout_kills_the_command(tmp_path, source):
    src, _ = source
    s = Session(tmp_path, src)
    t0 = time.time()
    g = run_grading("test_runner", {"command": "echo 'PASSED early'; sleep 60", "timeout_seconds": 1.5},
                    TRAJ, s.context())
    assert time.time() - t0 < 10
    assert g.status == "timeout" and g.reward == 0.0 and g.details["timed_out"]
    assert g.tests == {"early": "PASSED"}  # what ran before the budget ran out is kept


class Hangs(Grader):
    def evaluate(self, trajectory, context):
        time.sleep(30)


def test_hung_grader_is_a_timeout_not_a_crash():
    t0 = time.time()
    g = run_grading(f"{__name__}:Hangs", {"timeout_seconds": 0.5}, TRAJ, grace=0.5)
    assert time.time() - t0 < 5
    assert g.status == "timeout" and g.reward is None and "still running" in g.details["error"]


class Boom:
    def start(self, *a, **k):
        raise RuntimeError("no container runtime on this node")


def test_infrastructure_errors_are_error_status(tmp_path, source):
    src, _ = source
    s = Session(tmp_path, src)
    # a fresh runtime that cannot start (the live one, used for the diff, works)
    cfg = {"command": "true", "fresh": True, "repo_source": str(src), "repo_dir": "repo"}
    made = []

    def factory(backend):
        made.append(backend)
        return get_runtime(backend) if len(made) == 1 else Boom()

    ctx = s.context(get_runtime=factory)
    s.edit("calc/__init__.py", *FIX)
    g = run_grading("test_runner", cfg, TRAJ, ctx)
    assert g.status == "error" and g.reward is None and "could not start" in g.details["error"]
    # git missing in the runtime
    g = run_grading("test_runner", {**cfg, "git": "/nonexistent/git"}, TRAJ, s.context())
    assert g.status == "error" and "git" in g.details["error"]
    # no runtime at all (the session never started)
    g = run_grading("test_runner", {"command": "true"}, TRAJ, GradeContext(runtime=None))
    assert g.status == "error" and "no runtime" in g.details["error"]
    # repo_source missing
    g = run_grading("test_runner", {**cfg, "repo_source": str(tmp_path / "nope")}, TRAJ, s.context())
    assert g.status == "error" and "repo_source" in g.details["error"]
    # a config that does not load is an error too, not an exception
    g = run_grading("test_runner", {"command": "true", "bogus": 1}, TRAJ, s.context())
    assert g.status == "error" and "bogus" in g.details["error"]


# --- offline SFT --------------------------------------------------------------------------------------
def _sft_traj(sid: str) -> Trajectory:
    trace = Trace([1], [2], [1], messages=[{"role": "user", "content": "fix it"},
                                           {"role": "assistant", "content": "done"}],
                  tools=[{"type": "function", "function": {"name": "bash"}}])
    return Trajectory(session_id=sid, task_id="t", status="COMPLETED", traces=[trace])


def test_offline_sft_keeps_only_passing(tmp_path):
    path = sft.sft_path(tmp_path, "t", {})
    assert path == tmp_path / "t" / "sft.jsonl"
    first = _sft_traj("a")
    assert sft.record(path, first, Grade(1.0, passed=True)) == "accepted"
    assert first.metadata["sft_file"] == str(path)
    assert sft.record(path, _sft_traj("b"), Grade(0.0)) == "rejected"
    assert sft.record(path, _sft_traj("c"), Grade(0.5), threshold=0.5) == "accepted"
    assert sft.record(path, _sft_traj("d"), Grade.error("runtime down")) == "error"
    assert sft.record(path, _sft_traj("e"), Grade(1.0, passed=False)) == "rejected"  # swebench: not resolved
    assert sft.record(path, _sft_traj("a"), Grade(1.0, passed=True)) == "accepted"  # idempotent
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["session_id"] for r in rows] == ["a", "c"]
    assert rows[0]["messages"][-1] == {"role": "assistant", "content": "done"} and rows[0]["tools"]
    stats = sft.read_stats(path)
    assert (stats["attempted"], stats["accepted"], stats["errors"], stats["rows"]) == (4, 2, 1, 2)
    assert stats["acceptance_rate"] == 0.5
    assert sft.summarize(["accepted", "rejected", "error", None]) == {"attempted": 2, "accepted": 1, "errors": 1,
                                                                      "acceptance_rate": 0.5}
    # the rows as the file has them, rebuilt from stored trajectories (what `results --format sft` exports)
    first.metadata["grade"] = {"metadata": {"instance_id": "i-1"}}
    assert [{**r, "instance_id": "i-1"} for r in rows[:1]] == list(sft.offline_sft_rows([first]))
    assert sft_options({"keep_only_passing": True, "sft_path": "/x"}) == {"keep_only_passing": True, "sft_path": "/x"}
    assert sft_options({"command": "x"}) is None


def test_unknown_config_keys_are_rejected():
    with pytest.raises(ValueError, match="unknown config"):
        load_grader("test_runner", {"command": "x", "comand": "y"})
    with pytest.raises(ValueError, match="eval_script or config.eval_command"):
        load_grader("swebench", {"instance": {"instance_id": "x"}})


class SeesItsSession(Grader):
    """A plug-in that grades from the session record and the task the pipeline passes."""

    def evaluate(self, trajectory, context):
        return Grade(1.0 if context.session.outcome == "COMPLETED" else 0.0,
                     {"task": context.task.task_id, "runtime": context.runtime.backend,
                      "image": context.runtime_spec.image, "left": context.remaining() > 0})


def test_grade_context_for_a_session_carries_the_typed_record_and_task(tmp_path):
    from polar_mq.model import RuntimeHandle, SessionRecord
    from polar_mq.taskspec import parse_task

    task = parse_task({"task_id": "t-ctx", "instruction": "x", "agent": {"harness": "shell", "model": "m", "options": {"command": "true"}},
                       "runtime": {"backend": "local", "image": "img"}})
    rec = SessionRecord(session_id="s-ctx", task_id="t-ctx", outcome="COMPLETED",
                        runtime=RuntimeHandle(backend="local", session_dir=str(tmp_path), workdir=str(tmp_path)))
    ctx = GradeContext.for_session(rec, task, tmp_path)
    assert (ctx.session_id, ctx.task_id, ctx.runtime, ctx.runtime_spec) == ("s-ctx", "t-ctx", rec.runtime, task.runtime)
    assert ctx.log_dir() == tmp_path / "logs" / "grader"
    g = run_grading(f"{__name__}:SeesItsSession", {"timeout_seconds": 5}, TRAJ, ctx)
    assert g.reward == 1.0 and g.details == {"task": "t-ctx", "runtime": "local", "image": "img", "left": True}
    assert ctx.deadline is None  # the grader got its own copy with the budget's deadline


def test_instant_grader_runs_in_the_callers_thread_plugins_keep_their_budget_thread(monkeypatch):
    import threading

    from polar_mq import graders

    seen: list[str] = []

    class Spy(graders.CompletionGrader):
        def evaluate(self, trajectory, context):
            seen.append(threading.current_thread().name)
            return super().evaluate(trajectory, context)

    monkeypatch.setitem(graders._BUILTIN, "completion", f"{__name__}:_SpyHolder.cls")
    monkeypatch.setattr(_SpyHolder, "cls", Spy, raising=False)
    assert graders.is_instant("completion")
    grade = run_grading("completion", None, TRAJ)
    assert grade.reward == 1.0 and grade.status == "ok" and seen == [threading.current_thread().name]
    # The same class registered as a plug-in is not trusted to be instant: graded in a thread.
    monkeypatch.setitem(graders._REGISTERED, "my-completion", Spy)
    assert not graders.is_instant("my-completion") and not graders.is_instant("test_runner")
    grade = run_grading("my-completion", None, TRAJ)
    assert grade.reward == 1.0 and seen[-1] == "grade-s1"


class _SpyHolder:
    cls: object = None
