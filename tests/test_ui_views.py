"""The viewer's pure views: GRPO advantages, call boundaries inside a merged trace, divergences."""

from __future__ import annotations

import math

import pytest

from polar_mq.api.ui_views import advantages, call_boundaries, divergence, timeline
from polar_mq.model import SessionRecord, Trace


def test_advantages_centre_and_normalise_over_known_rewards():
    centred, normed, mean, std = advantages([1.0, 0.0, None, 1.0])
    assert mean == pytest.approx(2 / 3) and std == pytest.approx(math.sqrt(2 / 9))
    assert centred[2] is None and normed[2] is None
    assert centred[0] == pytest.approx(1 / 3) and centred[1] == pytest.approx(-2 / 3)
    assert normed[0] == pytest.approx((1 / 3) / math.sqrt(2 / 9))
    assert advantages([0.5, 0.5])[1] == [0.0, 0.0]  # equal rewards: no signal, not a division by 0
    assert advantages([None]) == ([None], [None], None, None)


def test_call_boundaries_line_calls_up_with_the_trace():
    trace = Trace(prompt_ids=[1, 2, 3], response_ids=[10, 11, 5, 6, 12, 13], loss_mask=[1, 1, 0, 0, 1, 1],
                  call_ids=["a", "b", "c"])
    calls = {"a": (0, {"prompt_token_ids": [1, 2, 3], "completion_token_ids": [10, 11]}),
             "b": (1, {"prompt_token_ids": [1, 2, 3, 10, 11, 5, 6], "completion_token_ids": [12, 13]}),
             "c": (2, {"prompt_token_ids": [1, 2, 3, 10], "completion_token_ids": [99]})}  # does not line up
    assert [(b["call_id"], b["position"]) for b in call_boundaries(trace, calls)] == [("a", 3), ("b", 7)]


def test_divergence_shows_both_sides_after_the_shared_prefix():
    d = divergence("fork", [1, 2, 3, 4, 5], [1, 2, 3, 9], against_trace=0)
    assert d["shared_tokens"] == 3 and d["ours_ids"] == [4, 5] and d["theirs_ids"] == [9]
    assert d["context_ids"] == [1, 2, 3] and d["against_trace"] == 0


def test_timeline_ends_a_running_state_now_and_a_terminal_one_at_once():
    rec = SessionRecord(session_id="s", task_id="t", state="RUNNING",
                        history=[["REGISTERED", 10.0, None], ["RUNNING", 12.0, "n1"]])
    tl = timeline(rec, now=20.0)
    assert [(s["state"], s["seconds"], s["node"]) for s in tl] == [("REGISTERED", 2.0, None), ("RUNNING", 8.0, "n1")]
    rec.history.append(["COMPLETED", 15.0, "n1"])
    assert timeline(rec, now=99.0)[-1]["seconds"] == 0.0
