"""Graders in the real pipeline (Celery worker pools, redis, gateway, stand-in model): the shell
harness edits a repository, the grader runs in postrun before teardown."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.support.grading import FAIL_TO_PASS, instance, make_repo
from tests.support.pipeline import TINY_AGENT, agent_task, running_pipeline
from polar_mq import states
from polar_mq.graders.swebench import swebench_available

PY = sys.executable
FIX_CMD = "sed -i 's/return a + b  # BUG/return a \\* b/' calc/__init__.py"
TESTS = f"{PY} -m pytest -rA -p no:cacheprovider tests"


@pytest.fixture(scope="module")
def pipeline(gateway, tmp_path_factory):
    yield from running_pipeline(gateway, tmp_path_factory, "graders-pipeline", init=2, run=2, postrun=2)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> tuple[Path, str]:
    repo = tmp_path_factory.mktemp("src") / "calc"
    return repo, make_repo(repo)


def repo_task(src: Path, edit: str, grader: dict, **overrides) -> dict:
    """The tiny agent talks to the model (so there are traces), then the command edits repo/."""
    command = f"{PY} {TINY_AGENT} && cd repo && {edit}"
    return agent_task(num_samples=1, timeout_seconds=60,
                      agent={"harness": "shell", "options": {"command": command}},
                      runtime={"backend": "local", "prepare": [{"upload": {"src": str(src), "dst": "repo"}}]},
                      grader=grader, **overrides)


def test_test_runner_rewards_the_fix(pipeline, source):
    src, _ = source
    grader = {"strategy": "test_runner", "config": {"command": TESTS, "repo_dir": "repo"}}
    _, good = pipeline.submit(repo_task(src, FIX_CMD, grader))
    _, bad = pipeline.submit(repo_task(src, "true", grader))
    [g, b] = pipeline.wait(good + bad, timeout=120)
    assert g.state == b.state == states.COMPLETED
    assert g.reward == 1.0 and b.reward == 0.0
    gt, bt = pipeline.store.get_trajectory(g.session_id), pipeline.store.get_trajectory(b.session_id)
    assert gt.reward == 1.0 and all(t.reward == 1.0 for t in gt.traces) and gt.traces
    assert gt.metadata["grade"]["status"] == "ok" and gt.metadata["grade"]["passed"] is True
    assert bt.metadata["grade"]["tests"]["tests/test_calc.py::test_mul"] == "FAILED"
    assert bt.metadata["grade"]["details"]["failed"] == 2
    # the grader's logs stay with the session
    assert list((Path(pipeline.env["POLAR_SESSIONS_DIR"]) / g.task_id / g.session_id / "logs" / "grader").iterdir())


def test_grader_timeout_and_infra_error_keep_the_traces(pipeline, source, tmp_path):
    src, _ = source
    slow = {"strategy": "test_runner", "config": {"command": "sleep 60", "timeout_seconds": 2}}
    broken = {"strategy": "test_runner", "config": {"command": TESTS, "repo_dir": "repo", "fresh": True,
                                                     "repo_source": str(tmp_path / "missing")}}
    _, s1 = pipeline.submit(repo_task(src, FIX_CMD, slow))
    _, s2 = pipeline.submit(repo_task(src, FIX_CMD, broken))
    [t, e] = pipeline.wait(s1 + s2, timeout=120)
    tt, et = pipeline.store.get_trajectory(t.session_id), pipeline.store.get_trajectory(e.session_id)
    # timeout: the run's outcome stands, reward 0, the grade says timeout, traces kept
    assert t.state == states.COMPLETED and t.reward == 0.0 and tt.traces
    assert tt.metadata["grade"]["status"] == "timeout" and tt.metadata["grade"]["details"]["timed_out"]
    # infrastructure failure: ERROR with reward None (masked by trainers), traces kept
    assert e.state == states.ERROR and e.reward is None and et.traces
    assert "repo_source" in e.error and et.metadata["grade"]["status"] == "error"


@pytest.mark.skipif(swebench_available() != "5.0.2", reason="needs swebench==5.0.2: pip install 'polar_mq[swebench]'")
def test_swebench_offline_sft(pipeline, source, tmp_path):
    """Offline SFT: two tasks (one instance solved, one not) share one SFT file; only the resolved
    trajectory is exported, with accepted/attempted counts."""
    src, base = source
    sft_file = tmp_path / "sft" / "calc.jsonl"
    grader = {"strategy": "swebench", "config": {"instance": instance(base), "repo_dir": "repo",
                                                  "repo_source": str(src), "keep_only_passing": True,
                                                  "sft_path": str(sft_file), "timeout_seconds": 120}}
    _, good = pipeline.submit(repo_task(src, FIX_CMD, grader))
    _, bad = pipeline.submit(repo_task(src, "sed -i 's/# BUG/# still buggy/' calc/__init__.py", grader))
    [g, b] = pipeline.wait(good + bad, timeout=120)
    assert (g.state, g.reward, b.state, b.reward) == (states.COMPLETED, 1.0, states.COMPLETED, 0.0)
    gt = pipeline.store.get_trajectory(g.session_id)
    assert gt.metadata["sft_file"] == str(sft_file)  # where `polar-mq results --format sft` finds the counts
    assert gt.metadata["sft"] == "accepted" and pipeline.store.get_trajectory(b.session_id).metadata["sft"] == "rejected"
    assert sorted(gt.metadata["grade"]["details"]["tests_status"]["FAIL_TO_PASS"]["success"]) == sorted(FAIL_TO_PASS)
    rows = [json.loads(line) for line in sft_file.read_text().splitlines()]
    assert [r["session_id"] for r in rows] == [g.session_id]
    assert rows[0]["messages"][-1]["role"] == "assistant" and rows[0]["tools"][0]["function"]["name"] == "write_file"
    assert rows[0]["instance_id"] == "calc__calc-1"
    stats = json.loads(Path(str(sft_file) + ".stats.json").read_text())
    assert (stats["attempted"], stats["accepted"], stats["acceptance_rate"]) == (2, 1, 0.5)
