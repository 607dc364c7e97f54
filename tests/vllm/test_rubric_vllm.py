"""Grader `rubric` with real vLLM (CPU, the tiny overfit model) as the judge, through the gateway.

The agent's session is real too: the tiny model's tool-call round trip through the gateway, its
trajectory built by the gateway. The judge runs in its own gateway session (`<session>.judge`,
metadata role judge), pinned to temperature 0 and the seed: judging the same trajectory twice
gives the same answer, token for token. The tiny model was trained on file-writing turns, not on
grading: it answers its write call's JSON (`{"name": "write", "arguments": ...}`), not the asked
`{"scores": ...}`, so the grade is ERROR (masked, reward None, never
0) with the judge's prompt, answer and records kept for audit. A model that does answer the JSON
gets its per-criterion scores (tests/graders/test_graders_rubric.py, the stand-in as judge).
"""

from __future__ import annotations

import uuid

import pytest

from tests.support.servers import AUTH
from polar_mq.graders.base import ERROR, GradeContext
from polar_mq.graders.rubric import RubricGrader, parse_answer
from polar_mq.model import Trajectory
from polar_mq.store.retention import judge_session_id
from polar_mq.tasks.app.context import GatewayClient

SERVED = "tiny"
ASK = "Write hello from polar to polar.txt."
WRITE = {"type": "function", "function": {"name": "write", "description": "Write content to a file.",
                                          "parameters": {"type": "object", "required": ["path", "content"],
                                                         "properties": {"path": {"type": "string"},
                                                                        "content": {"type": "string"}}}}}


@pytest.fixture(scope="module")
def agent_trajectory(vllm_gateway) -> Trajectory:
    import openai

    s = vllm_gateway.new_session()
    c = openai.OpenAI(base_url=s["base_urls"]["openai"], api_key=s["key"], max_retries=0)
    reply = c.chat.completions.create(model=SERVED, messages=[{"role": "user", "content": ASK}], tools=[WRITE],
                                      max_tokens=64)
    assert reply.choices[0].message.tool_calls, reply  # the overfit model's write call
    return Trajectory.from_dict(vllm_gateway.trajectory(s["session_id"]))


def judge(vllm_gateway, trajectory: Trajectory):
    grader = RubricGrader(rubric="The agent must write 'hello from polar' into polar.txt.",
                          judge_model=SERVED, criteria=["correct", "tidy"], seed=11, max_tokens=48)
    sid = f"rubric-vllm-{uuid.uuid4().hex[:8]}"
    gateway = GatewayClient(vllm_gateway.url, token=AUTH["Authorization"].split()[1])
    return sid, grader.evaluate(trajectory, GradeContext(session_id=sid, task_id="rubric-vllm", gateway=gateway))


def test_real_vllm_judge_is_deterministic_and_its_failure_is_masked(vllm_gateway, agent_trajectory):
    assert agent_trajectory.traces and agent_trajectory.status == "COMPLETED"
    first_sid, first = judge(vllm_gateway, agent_trajectory)
    second_sid, second = judge(vllm_gateway, agent_trajectory)

    for sid, grade in ((first_sid, first), (second_sid, second)):
        audit = grade.details["judge"]
        assert audit["session_id"] == judge_session_id(sid) and audit["model"] == SERVED
        assert "polar.txt" in audit["prompt"][-1]["content"]  # the judged transcript, kept
        assert audit["sampling"] == {"temperature": 0.0, "seed": 11}
        # Recorded by the gateway in the judge's own session, marked, pinned sampling as sent.
        [rec] = vllm_gateway.calls(judge_session_id(sid))
        assert rec["metadata"] == {"role": "judge"} and rec["status"] == "ok"
        assert rec["params"]["temperature"] == 0 and rec["params"]["seed"] == 11
        assert rec["completion_token_ids"] and audit["records"][0]["call_id"] == rec["call_id"]

    # Deterministic: the same trajectory judged twice gets the same answer, token for token.
    assert isinstance(first.details["judge"]["answer"], str) and first.details["judge"]["answer"]
    assert first.details["judge"]["answer"] == second.details["judge"]["answer"]
    ids = [vllm_gateway.calls(judge_session_id(s))[0]["completion_token_ids"] for s in (first_sid, second_sid)]
    assert ids[0] == ids[1]

    # What is true of the tiny model: its answer is not the asked JSON -> ERROR, masked, never 0.
    answer = first.details["judge"]["answer"]
    with pytest.raises(ValueError):
        parse_answer(answer, [{"name": "correct"}, {"name": "tidy"}])
    for grade in (first, second):
        assert grade.status == ERROR and grade.reward is None and grade.passed is False
        # a parse failure (the answer came back), not a transport one
        assert "no 'scores' object" in grade.details["error"] or "not JSON" in grade.details["error"]
        assert "criteria" not in grade.details
        assert grade.details["judge"]["answer"] == answer  # kept for audit
    print(f"tiny judge answered {answer!r}: {first.details['error']}")
