"""One tool round trip per provider API with the official SDKs (the demo's round trips), checked
end to end: the sampled ids of turn 1 re-appear verbatim in the prompt of turn 2, so the session
merges into one trace. Key order, tool-argument JSON and history conversion all matter here."""

from __future__ import annotations

import pytest
import requests

from polar_mq.demo import ROUND_TRIPS


@pytest.mark.parametrize("provider,round_trip", ROUND_TRIPS, ids=[p for p, _ in ROUND_TRIPS])
def test_round_trip_keeps_the_prefix_property(gateway, provider, round_trip):
    session = gateway.new_session()
    round_trip(session)
    calls = gateway.calls(session["session_id"])
    assert [c["provider"] for c in calls] == [provider, provider]
    assert [c["finish_reason"] for c in calls] == ["tool_calls", "stop"]
    first, second = calls
    assert second["stream"] is True or provider == "openai_chat"
    head = first["prompt_token_ids"] + first["completion_token_ids"]
    assert second["prompt_token_ids"][: len(head)] == head
    for c in calls:
        assert len(c["completion_logprobs"]) == len(c["completion_token_ids"]) > 0
    traj = requests.get(f"{gateway.url}/sessions/{session['session_id']}/trajectory",
                        params={"builder": "prefix_merging"}, timeout=10).json()
    assert traj["stats"]["traces"] == 1 and traj["stats"]["delivered_fraction"] == 1.0
    trace = traj["traces"][0]
    assert trace["prompt_ids"] + trace["response_ids"] == second["prompt_token_ids"] + second["completion_token_ids"]
    assert sum(trace["loss_mask"]) == len(first["completion_token_ids"]) + len(second["completion_token_ids"])
