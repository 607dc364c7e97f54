"""A call its gateway process took with it (a `gateway_lost` error record, no tokens) is not
trainable, the retry continues the conversation as if the lost call never happened, and the
trajectory lists the lost call with the call that retried it (merge/lost.py)."""

from __future__ import annotations

import pytest

from polar_mq.merge import build
from polar_mq.model import GATEWAY_LOST, CaptureRecord


def rec(cid, t, prompt, completion, **kw) -> CaptureRecord:
    return CaptureRecord(session_id="s", provider="anthropic", call_id=cid, started_at=t,
                         prompt_token_ids=prompt, completion_token_ids=completion,
                         completion_logprobs=[-0.1] * len(completion), finish_reason="stop", **kw)


def lost(cid, t) -> CaptureRecord:
    return CaptureRecord(session_id="s", provider="anthropic", call_id=cid, started_at=t, status="error",
                         error=f"{GATEWAY_LOST}: gateway process h:1:x stopped heart-beating")


@pytest.mark.parametrize("builder", ["prefix_merging", "per_request"])
def test_the_retry_of_a_lost_call_continues_and_is_linked(builder):
    first = rec("c1", 1.0, [1, 2, 3], [4, 5])
    retry = rec("c3", 3.0, [1, 2, 3, 4, 5, 6], [7, 8], retry_count=1)
    records = [retry, lost("c2", 2.0), first]
    traj = build(builder, records, session_id="s")
    assert all("c2" not in t.call_ids for t in traj.traces)  # never trainable
    assert traj.stats["lost_calls"] == 1 and traj.stats["skipped"].get("error") == 1
    [entry] = traj.metadata["lost_calls"]
    assert entry["call_id"] == "c2" and entry["retried_by"] == "c3" and entry["retry_count"] == 1
    holder = traj.traces[entry["retry_trace_index"]]
    assert "c3" in holder.call_ids and holder.metadata["retry_of_lost"] == ["c2"]
    if builder == "prefix_merging":  # one conversation: the retry extends the first call's trace
        [trace] = traj.traces
        assert trace.call_ids == ["c1", "c3"] and trace.metadata["origin"] == "root"


def test_a_call_with_a_real_record_was_not_lost():
    """A gateway that was only silent may store the real record after a reaper wrote the
    error: the ok record wins and nothing is listed as lost."""
    records = [rec("c1", 1.0, [1, 2], [3]), lost("c1", 1.0)]
    traj = build("prefix_merging", records, session_id="s")
    assert "lost_calls" not in traj.stats and "lost_calls" not in traj.metadata
    assert traj.traces[0].call_ids == ["c1"]


def test_a_lost_call_at_the_end_has_no_retry():
    traj = build("per_request", [rec("c1", 1.0, [1, 2], [3]), lost("c2", 2.0)], session_id="s")
    assert traj.metadata["lost_calls"][0]["retried_by"] is None
    assert traj.metadata["lost_calls"][0]["retry_trace_index"] is None
