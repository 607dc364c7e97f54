"""The viewer's pure views: group advantages, call boundaries inside a merged trace, divergences."""

from __future__ import annotations

import math

import pytest

from polar_mq.api.ui.views import call_boundaries, divergence, group_view, timeline
from polar_mq.model import SessionRecord, Trace


def test_group_view_uses_the_trainers_advantages():
    from polar_mq.rl.advantages import group_advantages

    records = [SessionRecord(session_id=f"s{i}", task_id="t", index=i, state=st, reward=r)
               for i, (st, r) in enumerate([("COMPLETED", 1.0), ("COMPLETED", 0.0), ("ERROR", None), ("COMPLETED", 1.0)])]
    view = group_view("t", {"spec": {"instruction": "x"}}, records, {})
    rewards = [1.0, 0.0, None, 1.0]
    assert [s["advantage"] for s in view["samples"]] == group_advantages(rewards, scale=False)
    assert [s["advantage_normalised"] for s in view["samples"]] == group_advantages(rewards)
    assert [s["advantage_leave_one_out"] for s in view["samples"]] == group_advantages(rewards, "leave_one_out")
    assert view["samples"][2]["advantage"] is None
    assert view["mean_reward"] == pytest.approx(2 / 3) and view["reward_std"] == pytest.approx(math.sqrt(1 / 3))
    assert view["unusable"] is None
    same = group_view("t", {"spec": {}}, [records[0], records[3]], {})
    assert same["unusable"] == "uniform_reward"


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


def test_lineage_tree_nests_subagents_and_compaction():
    from polar_mq.api.ui.tree import lineage_tree

    def t(meta, versions=None):
        return Trace(prompt_ids=[1], response_ids=[2], loss_mask=[1], call_ids=["c"], metadata=meta,
                     policy_versions=versions or [[0, 1]])

    traces = [t({"origin": "root"}),
              t({"origin": "sub_agent", "spawned_by": {"trace_index": 0, "call_id": "c", "tool_call_id": "tc1",
                                                       "tool": "Agent"}}),
              t({"origin": "sub_agent", "spawned_by": {"trace_index": 1, "call_id": "c", "tool_call_id": "tc2",
                                                       "tool": "Agent"}}, [[0, 1], [5, 2]]),
              t({"origin": "compaction", "continues_from": {"trace_index": 0, "reason": "compaction"}}),
              t({"origin": "retry", "parent_trace": 4}),  # a cycle onto itself: drawn as a root
              t({"origin": "fork", "parent_trace": 99})]  # a missing trace: a root
    tree = lineage_tree(traces)
    assert [(n["index"], n["parent"], n["depth"]) for n in tree] == [
        (0, None, 0), (1, 0, 1), (2, 1, 2), (3, 0, 1), (4, None, 0), (5, None, 0)]
    assert tree[1]["edge"] == "spawned by Agent (tc1)" and tree[3]["edge"] == "continues after compaction"
    assert tree[2]["versions"] == [1, 2]
