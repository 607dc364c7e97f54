"""Long runs through the whole pipeline (real Celery workers, gateway, redis-server, stand-in):
the budget ending during a call aborts it upstream and keeps it; the task's sampling policy is
what sampled the trajectory; finished sessions leave only their logs on disk."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import requests

from tests.support.servers import GatewayHandle, start_gateway, start_model_server, stop
from tests.support.pipeline import agent_task, make_pipeline
from polar_mq import states

TOKEN_MS = 25  # polar:long is ~1700 tokens: ~43 s of generation, far beyond the budgets below

ONE_CALL = ("import os\nfrom openai import OpenAI\n"
            "r = OpenAI(max_retries=0).chat.completions.create(model='m', max_tokens=4000, temperature=1.0,\n"
            "    messages=[{'role': 'user', 'content': os.environ['POLAR_INSTRUCTION']}])\n"
            "print(r.choices[0].message.content)\n")


@pytest.fixture(scope="module")
def slow_gw(log_dir, redis_url):
    ms = start_model_server(log_dir, "--max-model-len", "65536", "--token-latency-ms", str(TOKEN_MS),
                            name="ms-longrun")
    gw = start_gateway(log_dir, redis_url, [ms.url], name="gw-longrun")
    yield GatewayHandle(url=gw.url, upstream_url=ms.url, redis_url=redis_url, server=gw)
    stop(gw.proc)
    stop(ms.proc)


@pytest.fixture(scope="module")
def pipeline(slow_gw, tmp_path_factory):
    p = make_pipeline(slow_gw, tmp_path_factory.mktemp("longrun"), POLAR_KEEP_WORKDIRS="0")
    for stage in ("init", "run", "postrun"):
        p.start_worker(stage, 1)
    yield p
    p.stop()


def aborted(gw: GatewayHandle) -> list[dict]:
    return requests.get(f"{gw.upstream_url}/polar/generations", timeout=10).json()["aborted"]


def test_budget_ends_during_a_call_the_call_is_aborted_upstream_and_kept(pipeline, slow_gw):
    before = len(aborted(slow_gw))
    t0 = time.time()
    _, [sid] = pipeline.submit(agent_task(
        num_samples=1, timeout_seconds=10, instruction="polar:long tell a long story",
        agent={"harness": "shell", "model": "m", "options": {"command": [sys.executable, "-c", ONE_CALL]},
               "sampling": {"temperature": 0.6, "seed": 3}}))
    [rec] = pipeline.wait([sid], timeout=60)
    assert rec.state == states.TIMEOUT, (rec.state, rec.error)
    assert time.time() - t0 < 38  # nobody waited for the 43 s generation
    gone = aborted(slow_gw)[before:]
    assert len(gone) == 1 and gone[0]["sent_tokens"] < gone[0]["planned_tokens"]
    [call] = slow_gw.calls(rec.gateway_session_id)
    assert call["status"] == "error" and "cancelled" in call["error"]
    assert 0 < len(call["completion_token_ids"]) <= gone[0]["sent_tokens"]
    assert call["params"]["temperature"] == 0.6 and call["requested_params"]["temperature"] == 1.0
    traj = pipeline.store.get_trajectory(sid)
    assert traj.stats["calls"] == 1 and traj.stats["calls_in_flight_at_build"] == 0
    # The call in flight at the timeout is in the trajectory with what it sampled.
    assert call["finish_reason"] == "abort" and traj.stats["aborted_calls"] == 1
    [trace] = traj.traces
    assert trace.call_ids == [call["call_id"]] and trace.finish_reason == "abort"
    assert trace.response_ids == call["completion_token_ids"] and set(trace.loss_mask) == {1}
    assert trace.response_logprobs == call["completion_logprobs"] and trace.metadata["aborted"]
    assert traj.metadata["sampling"]["policy"] == {"temperature": 0.6, "seed": 3}


def test_sampling_policy_in_records_and_trajectory_and_workdirs_removed(pipeline, slow_gw):
    policy = {"temperature": 0.3, "top_p": 0.9, "max_tokens": 64}
    _, [sid] = pipeline.submit(agent_task(
        num_samples=1, timeout_seconds=60,
        agent={"harness": "shell", "model": "m",
               "options": {"command": [sys.executable, "-c", "from pathlib import Path; Path('out.txt').write_text('x')"]},
               "sampling": policy}))
    [rec] = pipeline.wait([sid], timeout=60)
    assert rec.state == states.COMPLETED, rec.error
    sdir = Path(rec.runtime.session_dir)
    assert sdir.is_dir() and sorted(p.name for p in sdir.iterdir()) == ["logs"]  # work dir and HOME gone
    assert any((sdir / "logs").iterdir())
    traj = pipeline.store.get_trajectory(sid)
    assert traj.metadata["sampling"] == {"policy": policy, "enforced": True, "params": []}  # no calls made


def test_bad_sampling_policy_names_the_field():
    from polar_mq.taskspec import ValidationError, parse_task
    for policy, field in (({"top_k": 0}, "agent.sampling.top_k"), ({"temp": 1}, "agent.sampling.temp"),
                          ({"stop": [""]}, "agent.sampling.stop"), ({"max_tokens": True}, "agent.sampling.max_tokens")):
        body = agent_task(agent={"harness": "shell", "options": {"command": "true"}, "sampling": policy})
        with pytest.raises(ValidationError) as err:
            parse_task(body)
        assert err.value.field == field
    ok = parse_task(agent_task(agent={"harness": "shell", "options": {"command": "true"},
                                      "sampling": {"stop": "END", "temperature": 1}}))
    assert ok.agent.sampling == {"stop": ["END"], "temperature": 1.0}
