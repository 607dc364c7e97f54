"""Grader `rubric` through real Celery worker pools, the real gateway and the stand-in model server
as the judge (its `polar:say=` / `polar:fail=` directives script the judge's answers): scores per
criterion, the judge in a gateway session of its own marked `judge` and never in the trained
trajectory, pinned sampling, and a judge failure is ERROR (masked), not reward 0."""

from __future__ import annotations

import json

import pytest
import requests

from tests.support.servers import AUTH
from tests.support.pipeline import agent_task, running_pipeline
from polar_mq import states
from polar_mq.graders.rubric import normalise_criteria, parse_answer

SCORES = {"scores": {"correct": 1, "style": 0.5}, "explanation": "wrote the file as asked"}


@pytest.fixture(scope="module")
def pipeline(gateway, tmp_path_factory):
    yield from running_pipeline(gateway, tmp_path_factory, "rubric", init=1, run=2, postrun=2)


def rubric_task(task_id: str, rubric: str, **config):
    return agent_task(task_id=task_id, num_samples=1, grader={"strategy": "rubric", "config": {
        "rubric": rubric, "criteria": [{"name": "correct", "weight": 3}, "style"], "seed": 7, **config}})


def test_judge_scores_per_criterion_in_its_own_session(pipeline, gateway):
    rubric = f"The file must hold the greeting. polar:say={json.dumps(SCORES)}"
    _, [sid] = pipeline.submit(rubric_task("rubric-ok", rubric))
    [rec] = pipeline.wait([sid], timeout=90)
    assert rec.state == states.COMPLETED, rec.error
    traj = pipeline.store.get_trajectory(sid)
    grade = traj.metadata["grade"]
    assert grade["status"] == "ok" and grade["metadata"]["grader"] == "rubric"
    assert grade["details"]["criteria"] == {"correct": 1.0, "style": 0.5}
    assert traj.reward == pytest.approx((3 * 1.0 + 0.5) / 4)
    judge = grade["details"]["judge"]
    assert judge["session_id"] == f"{sid}.judge" and judge["answer"] == json.dumps(SCORES)
    assert "The file must hold the greeting." in judge["prompt"][-1]["content"]
    assert "Write hello into polar.txt" in judge["prompt"][-1]["content"]
    assert judge["records"] and all(r["metadata"] == {"role": "judge"} for r in judge["records"])
    # Deterministic: the gateway pinned temperature 0 and the seed on the judge's call.
    params = judge["records"][0]["params"]
    assert params["temperature"] == 0 and params["seed"] == 7

    # The judge's calls are recorded in its own session, marked, and never in the trajectory.
    served = requests.get(f"{gateway.url}/sessions/{sid}.judge/calls", headers=AUTH, timeout=10).json()["calls"]
    assert len(served) == 1 and served[0]["metadata"]["role"] == "judge"
    assert requests.get(f"{gateway.url}/sessions/{sid}.judge", headers=AUTH,
                        timeout=10).json()["metadata"]["role"] == "judge"
    trained = {cid for t in traj.traces for cid in t.call_ids}
    assert served[0]["call_id"] not in trained and trained
    own = requests.get(f"{gateway.url}/sessions/{sid}/calls", headers=AUTH, timeout=10).json()["calls"]
    assert all("metadata" not in c for c in own)


@pytest.mark.parametrize("directive,why", [("polar:fail=500", "answered 500"),
                                           ("polar:say=looks fine to me", "not JSON"),
                                           ('polar:say={"scores": {"correct": 1}}', "style")])
def test_judge_failure_is_error_never_reward_zero(pipeline, directive, why):
    task_id = "rubric-bad-" + str(abs(hash(directive)) % 10**8)
    _, [sid] = pipeline.submit(rubric_task(task_id, f"Grade it. {directive}"))
    [rec] = pipeline.wait([sid], timeout=120)
    assert rec.state == states.ERROR and rec.reward is None, (rec.state, rec.reward)
    grade = pipeline.store.get_trajectory(sid).metadata["grade"]
    assert grade["status"] == "error" and why in grade["details"]["error"], grade["details"]["error"]
    assert grade["details"]["judge"]["prompt"]  # kept for audit even when the judge failed


def test_answer_parsing_and_criteria():
    crit = normalise_criteria({"a": 2, "b": "is it tidy"})
    assert crit == [{"name": "a", "description": "", "weight": 2.0},
                    {"name": "b", "description": "is it tidy", "weight": 1.0}]
    assert parse_answer('```json\n{"scores": {"a": 0.5, "b": 1}}\n```', crit) == ({"a": 0.5, "b": 1.0}, "")
    with pytest.raises(ValueError):
        parse_answer('{"scores": {"a": 2, "b": 1}}', crit)  # out of range
    with pytest.raises(ValueError):
        normalise_criteria(["a", "a"])
    assert normalise_criteria(None)[0]["name"] == "overall"
