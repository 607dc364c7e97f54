"""Trajectory builders on hand-built token lists: exact layouts, labels, stats and the registry."""

from __future__ import annotations

import random
import sys
import types

import msgpack
import pytest

from polar_mq.merge import (PerRequestBuilder, PrefixMergingBuilder, available_builders, build, get_builder)
from polar_mq.merge.config import parse_config
from polar_mq.merge.trie import PrefixTrie, common_prefix_len
from polar_mq.model import CaptureRecord, Trace, Trajectory

EOS = 2
TOOLS = [{"type": "function", "function": {"name": "bash"}}]


def rec(cid, t, prompt, completion, lps="auto", finish="stop", **kw) -> CaptureRecord:
    if lps == "auto":
        lps = [-(t + k / 100) for k in range(len(completion))]
    return CaptureRecord(session_id="s", provider="openai_chat", call_id=cid, started_at=float(t),
                         prompt_token_ids=list(prompt), completion_token_ids=list(completion),
                         completion_logprobs=lps or [], finish_reason=finish, **kw)


def pm(records, **config) -> Trajectory:
    return build("prefix_merging", records, config or None, session_id="s")


def roles(traj):
    return [t.metadata["role"] for t in traj.traces]


# ---- the trie ---------------------------------------------------------------------------------

def test_common_prefix_len_long_sequences():
    a = list(range(100_000))
    b = a[:77_777] + [-1] + a[77_778:]
    assert common_prefix_len(a, 0, b, 0, len(a)) == 77_777
    assert common_prefix_len(a, 10, a, 10, 500) == 500
    assert common_prefix_len(a, 0, b, 0, 50) == 50


def test_trie_finds_every_stored_prefix_regardless_of_insertion_order():
    seqs = {"a": [1, 2, 3], "b": [1, 2, 3, 4, 5], "c": [1, 2, 9], "d": [1], "e": [1, 2, 3, 4, 5, 6]}
    for order in (list(seqs), list(reversed(seqs))):
        trie = PrefixTrie()
        for key in order:
            trie.insert(seqs[key], key)
        found = [(d, sorted(k)) for d, k in trie.prefixes_of([1, 2, 3, 4, 5, 7])]
        assert found == [(1, ["d"]), (3, ["a"]), (5, ["b"])]
        assert [(d, sorted(k)) for d, k in trie.prefixes_of([1, 2])] == [(1, ["d"])]


# ---- per_request ------------------------------------------------------------------------------

def test_per_request_one_trace_per_call_in_start_order():
    records = [rec("b", 2, [1, 5, 6], [7, EOS]), rec("a", 1, [1, 5], [6, EOS]),
               rec("x", 3, [1], [], status="error", error="boom"),
               rec("y", 4, [1, 5], [9], lps=[-0.1, -0.2])]  # logprobs do not line up
    traj = build("per_request", records, session_id="s", task_id="t")
    assert [t.call_ids for t in traj.traces] == [["a"], ["b"], ["y"]]
    assert traj.traces[0].loss_mask == [1, 1]
    assert traj.traces[0].response_logprobs == [-1.0, -1.01]
    assert traj.traces[2].response_logprobs is None
    assert traj.stats["skipped"] == {"error": 1}
    assert traj.stats["calls"] == 4 and traj.stats["traces"] == 3
    assert traj.stats["delivered_fraction"] == 1.0
    assert traj.builder == "per_request" and traj.task_id == "t" and traj.status == "COMPLETED"


def test_calls_without_ids_are_skipped_and_lower_delivery():
    records = [rec("a", 1, [1, 5], [6, EOS]), rec("b", 2, [], [8, 8, 8, EOS])]
    for name in ("per_request", "prefix_merging"):
        traj = build(name, records, session_id="s")
        assert traj.stats["skipped"] == {"no_token_ids": 1}
        assert traj.stats["delivered_fraction"] == pytest.approx(2 / 6)


def test_aborted_call_enters_both_builders_with_its_partial_answer_and_errors_stay_out():
    """A generation the gateway stopped (budget timeout, cancel) keeps what it sampled in the
    trajectory; a real upstream error with tokens does not."""
    ok = rec("a", 1, [1, 10], [20, EOS])
    cut = rec("b", 2, [1, 10, 20, EOS, 30], [40, 41, 42], finish="abort", status="error",
              error="permission: cancelled: the session was cancelled")
    broke = rec("c", 3, [1, 10, 20, EOS, 31], [50, 51], finish=None, status="error",
                error="upstream_error: stream broke")
    for name in ("per_request", "prefix_merging"):
        traj = build(name, [broke, cut, ok], session_id="s")
        assert traj.stats["skipped"] == {"error": 1}, name
        assert traj.stats["aborted_calls"] == 1 and traj.stats["delivered_fraction"] == 1.0
        [t] = [t for t in traj.traces if "b" in t.call_ids]
        assert t.response_ids[-3:] == [40, 41, 42] and t.loss_mask[-3:] == [1, 1, 1]
        assert t.response_logprobs[-3:] == [-2.0, -2.01, -2.02]
        assert t.finish_reason == "abort" and t.metadata["aborted"] is True
        assert all("c" not in t.call_ids for t in traj.traces)
    assert [t.metadata["aborted"] for t in build("per_request", [ok, cut], session_id="s").traces] == [False, True]
    merged = pm([ok, cut])
    assert len(merged.traces) == 1 and merged.traces[0].metadata["aborted_calls"] == 1


# ---- prefix_merging: layout -------------------------------------------------------------------

def test_linear_chain_becomes_one_trace_with_masks_and_logprobs():
    r1 = rec("a", 1, [1, 10, 11], [20, 21, EOS])
    r2 = rec("b", 2, [1, 10, 11, 20, 21, EOS, 30, 31], [22, EOS])
    r3 = rec("c", 3, [1, 10, 11, 20, 21, EOS, 30, 31, 22, EOS, 40], [23, EOS], finish="length")
    traj = pm([r3, r1, r2])
    assert len(traj.traces) == 1
    t = traj.traces[0]
    assert t.prompt_ids == [1, 10, 11]
    assert t.response_ids == [20, 21, EOS, 30, 31, 22, EOS, 40, 23, EOS]
    assert t.loss_mask == [1, 1, 1, 0, 0, 1, 1, 0, 1, 1]
    assert t.response_logprobs == [-1.0, -1.01, -1.02, 0.0, 0.0, -2.0, -2.01, 0.0, -3.0, -3.01]
    assert t.call_ids == ["a", "b", "c"] and t.finish_reason == "length"
    assert t.metadata["role"] == "main" and t.metadata["interstitial_tokens"] == 3
    assert traj.stats["breaks"] == 0 and traj.stats["delivered_fraction"] == 1.0
    assert traj.stats["eos_token_id"] == EOS and traj.stats["eos_source"] == "inferred"


def test_missing_eos_goes_in_as_an_interstitial_token():
    r1 = rec("a", 1, [1, 10], [20, 21])  # the upstream did not report the end-of-turn token
    r2 = rec("b", 2, [1, 10, 20, 21, EOS, 30], [22, EOS])
    traj = pm([r1, r2], eos_token_id=EOS)
    t = traj.traces[0]
    assert t.response_ids == [20, 21, EOS, 30, 22, EOS]
    assert t.loss_mask == [1, 1, 0, 0, 1, 1]
    assert t.metadata["eos_inserted"] == 1 and traj.stats["eos_source"] == "config"


def test_truncated_turn_merges():
    r1 = rec("a", 1, [1, 10], [20, 21, 22], finish="length")
    r2 = rec("b", 2, [1, 10, 20, 21, 22, EOS, 30], [23, EOS])
    traj = pm([r1, r2])
    assert len(traj.traces) == 1 and traj.stats["truncated_calls"] == 1
    assert traj.traces[0].metadata["truncated_calls"] == 1


def test_missing_logprobs_make_the_trace_logprobs_null_but_keep_tokens():
    r1 = rec("a", 1, [1, 10], [20, EOS], lps=None)
    r2 = rec("b", 2, [1, 10, 20, EOS, 30], [22, EOS])
    traj = pm([r1, r2])
    assert traj.traces[0].response_logprobs is None
    assert traj.traces[0].loss_mask == [1, 1, 0, 1, 1]
    assert traj.stats["calls_without_logprobs"] == 1


# ---- prefix_merging: breaks, branches and roles -------------------------------------------------

def test_retry_is_its_own_trace_and_the_continued_copy_keeps_the_chain():
    r1 = rec("a", 1, [1, 10], [20, EOS])
    lost = rec("b1", 2, [1, 10, 20, EOS, 30], [40, 41, EOS])  # same prompt, abandoned
    kept = rec("b2", 3, [1, 10, 20, EOS, 30], [50, EOS])
    r3 = rec("c", 4, [1, 10, 20, EOS, 30, 50, EOS, 31], [60, EOS])
    traj = pm([r3, kept, lost, r1])
    assert [t.call_ids for t in traj.traces] == [["a", "b2", "c"], ["b1"]]
    assert roles(traj) == ["main", "retry"]
    assert traj.traces[1].metadata["parent_trace"] == 0
    assert traj.traces[1].metadata["same_prompt_as_call_id"] == "b2"
    assert traj.stats["retries"] == 1 and traj.stats["delivered_fraction"] == 1.0


def test_fork_longest_branch_keeps_the_chain():
    r1 = rec("a", 1, [1, 10], [20, EOS])
    short = rec("f1", 2, [1, 10, 20, EOS, 30], [40, EOS])
    long1 = rec("g1", 3, [1, 10, 20, EOS, 31], [50, EOS])
    long2 = rec("g2", 4, [1, 10, 20, EOS, 31, 50, EOS, 32], [51, EOS])
    traj = pm([short, long2, r1, long1])
    assert [t.call_ids for t in traj.traces] == [["a", "g1", "g2"], ["f1"]]
    assert roles(traj) == ["main", "fork"]
    assert traj.traces[1].metadata["branch_call_id"] == "a"
    assert traj.traces[1].prompt_ids == [1, 10, 20, EOS, 30]
    assert traj.stats["break_kinds"] == {"fork": 1}


def test_retokenization_drift_keeps_every_sampled_token():
    r1 = rec("a", 1, [1, 10], [20, EOS])
    drift = rec("b", 2, [1, 10, 20, EOS, 30], [41, 42, EOS])  # sampled "4"+"1"... as two ids
    r3 = rec("c", 3, [1, 10, 20, EOS, 30, 43, EOS, 31], [60, EOS])  # re-rendered as one id
    r4 = rec("d", 4, [1, 10, 20, EOS, 30, 43, EOS, 31, 60, EOS, 32], [61, EOS])
    traj = pm([r4, r3, drift, r1])
    assert [t.call_ids for t in traj.traces] == [["a", "c", "d"], ["b"]]
    assert roles(traj) == ["main", "main"]
    assert traj.traces[1].metadata["break"] == "retokenization_drift"
    assert traj.stats["break_kinds"] == {"retokenization_drift": 1}
    assert traj.stats["delivered_fraction"] == 1.0


def test_eos_mismatch_is_named():
    r1 = rec("a", 1, [1, 10], [20, EOS])
    r2 = rec("b", 2, [1, 10, 20, 7, 30], [21, EOS])  # history rendered with another end token
    traj = pm([r1, r2])
    assert traj.stats["break_kinds"] == {"eos_mismatch": 1}
    assert [t.metadata["role"] for t in traj.traces] == ["main", "main"]
    assert traj.traces[1].metadata["continues_trace"] == 0


def _msgs(system, *turns):
    out = [{"role": "system", "content": system}]
    for role, text in turns:
        out.append({"role": role, "content": text})
    return out


def test_template_change_found_by_messages_resumes_the_conversation():
    m1 = _msgs("sys v1", ("user", "do it"))
    r1 = rec("a", 1, [1, 5, 10], [20, EOS], messages=m1, tools=TOOLS,
             response_message={"role": "assistant", "content": "ok"})
    m2 = _msgs("sys v2", ("user", "do it"), ("assistant", "ok"), ("user", "more"))
    r2 = rec("b", 2, [1, 6, 10, 20, EOS, 30], [21, EOS], messages=m2, tools=TOOLS,
             response_message={"role": "assistant", "content": "done"})
    r3 = rec("c", 3, [1, 6, 10, 20, EOS, 30, 21, EOS, 31], [22, EOS], messages=m2, tools=TOOLS)
    traj = pm([r3, r2, r1])
    assert [t.call_ids for t in traj.traces] == [["a"], ["b", "c"]]
    assert roles(traj) == ["main", "main"]
    assert traj.traces[1].metadata["break"] == "template_change"
    assert traj.traces[1].metadata["continues_trace"] == 0
    assert traj.stats["conversations"] == 1


def test_side_call_and_subagent_are_labelled():
    main = [rec(f"m{k}", 2 * k, [1, 5, 10] + list(range(100, 100 + 3 * k)), [200 + k, EOS],
                messages=_msgs("agent", ("user", "task")), tools=TOOLS) for k in range(4)]
    # make them a chain: each prompt = previous full + one glue token
    prompt = [1, 5, 10]
    for k, r in enumerate(main):
        r.prompt_token_ids = list(prompt)
        prompt = prompt + r.completion_token_ids + [300 + k]
    title = rec("t", 3, [1, 7, 11], [50, EOS], messages=_msgs("title it", ("user", "task")))
    sub1 = rec("s1", 5, [1, 8, 12], [60, EOS], finish="tool_calls", tools=TOOLS,
               messages=_msgs("sub", ("user", "look")))
    sub2 = rec("s2", 6, [1, 8, 12, 60, EOS, 13], [61, EOS], tools=TOOLS,
               messages=_msgs("sub", ("user", "look")))
    records = main + [title, sub1, sub2]
    random.Random(3).shuffle(records)
    traj = pm(records)
    by_role = {t.metadata["role"]: t for t in traj.traces}
    assert sorted(by_role) == ["main", "side", "subagent"]
    assert by_role["main"].call_ids == ["m0", "m1", "m2", "m3"]
    assert "no tools" in by_role["side"].metadata["role_reason"]
    assert by_role["subagent"].call_ids == ["s1", "s2"]
    assert by_role["subagent"].metadata["spawned_by_call_id"] == "m2"
    assert traj.stats["roles"] == {"main": 1, "side": 1, "subagent": 1}


def test_identical_duplicate_records_count_once():
    r1 = rec("a", 1, [1, 10], [20, EOS])
    traj = pm([r1, CaptureRecord.from_dict(r1.to_dict())])
    assert len(traj.traces) == 1 and traj.stats["skipped"] == {"duplicate": 1}


def test_single_call_is_identical_with_both_builders_and_dicts_are_accepted():
    r = rec("a", 1, [1, 10, 11], [20, 21, EOS], messages=_msgs("s", ("user", "u")),
            response_message={"role": "assistant", "content": "x"}, tools=TOOLS)
    a = build("per_request", [r.to_dict()], session_id="s").traces[0].to_dict()
    b = build("prefix_merging", [r], session_id="s").traces[0].to_dict()
    a.pop("metadata"), b.pop("metadata")
    assert a == b


def test_empty_session():
    for name in available_builders():
        traj = build(name, [], session_id="s", status="TIMEOUT")
        assert traj.traces == [] and traj.stats["delivered_fraction"] == 1.0
        assert traj.status == "TIMEOUT"


def test_trajectory_survives_msgpack_and_json_round_trip():
    import json
    r1 = rec("a", 1, [1, 10], [20, EOS])
    r2 = rec("b", 2, [1, 10, 20, EOS, 30], [22, EOS])
    traj = pm([r1, r2])
    data = traj.to_dict()
    assert Trajectory.from_dict(msgpack.unpackb(msgpack.packb(data))).to_dict() == data
    assert Trajectory.from_dict(json.loads(json.dumps(data))).to_dict() == data


# ---- registry and config ----------------------------------------------------------------------

def test_registry_names_and_errors():
    assert available_builders() == ["per_request", "prefix_merging"]
    assert isinstance(get_builder("prefix_merging", {"eos_token_id": 5}), PrefixMergingBuilder)
    assert isinstance(get_builder("per_request"), PerRequestBuilder)
    with pytest.raises(ValueError, match="unknown builder 'nope'"):
        get_builder("nope")
    with pytest.raises(ValueError, match="unknown config key 'eos'"):
        get_builder("prefix_merging", {"eos": 2})
    with pytest.raises(ValueError, match="'eos_token_id' must be int or null"):
        get_builder("prefix_merging", {"eos_token_id": "2"})
    with pytest.raises(ValueError, match="'eos_token_id' must be int"):
        get_builder("prefix_merging", {"eos_token_id": True})
    with pytest.raises(ValueError, match="'infer_eos' must be bool"):
        get_builder("prefix_merging", {"infer_eos": 1})
    with pytest.raises(ValueError, match="'min_shared_fraction' must be between"):
        get_builder("prefix_merging", {"min_shared_fraction": 2})
    with pytest.raises(ValueError, match="config must be a mapping"):
        get_builder("per_request", [1])
    with pytest.raises(ValueError, match="unknown config key 'x'"):
        build("per_request", [], {"x": 1}, session_id="s")
    with pytest.raises(ValueError, match="status"):
        build("per_request", [], session_id="s", status="DONE")
    assert parse_config(type(get_builder("prefix_merging").config),
                        {"min_shared_fraction": 1}, builder="b").min_shared_fraction == 1


def test_custom_builder_by_module_path(monkeypatch):
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Cfg:
        scale: int = 1

    class Reverse:
        name = "reverse"
        Config = Cfg

        def __init__(self, config):
            self.config = config

        def build(self, records):
            return [Trace(prompt_ids=r.prompt_token_ids,
                          response_ids=r.completion_token_ids[::-1] * self.config.scale,
                          loss_mask=[1] * len(r.completion_token_ids) * self.config.scale)
                    for r in records]

    module = types.ModuleType("custom_merge_mod")
    module.Reverse = Reverse
    monkeypatch.setitem(sys.modules, "custom_merge_mod", module)
    traj = build("custom_merge_mod:Reverse", [rec("a", 1, [1], [5, 6]).to_dict()], {"scale": 2},
                 session_id="s")
    assert traj.builder == "custom_merge_mod:Reverse"
    assert traj.traces[0].response_ids == [6, 5, 6, 5]
    assert traj.stats["calls"] == 1 and traj.stats["traces"] == 1
    assert traj.stats["delivered_fraction"] == 2.0  # honest even when a builder over-delivers
    with pytest.raises(ValueError, match="unknown config key 'scal'"):
        build("custom_merge_mod:Reverse", [], {"scal": 2}, session_id="s")
    with pytest.raises(ValueError, match="has no attribute"):
        get_builder("custom_merge_mod:Missing")
    with pytest.raises(ValueError, match="cannot import"):
        get_builder("no_such_module_xyz:Builder")


def test_merge_package_stays_pure():
    import subprocess
    code = ("import sys, polar_mq.merge, polar_mq.merge.synthetic; "
            "bad = [m for m in ('flask', 'celery', 'redis') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_history_replayed_by_another_agent_is_a_side_call_not_a_break():
    m1 = _msgs("agent", ("user", "do it"))
    r1 = rec("a", 1, [1, 5, 10], [20, EOS], messages=m1, tools=TOOLS,
             response_message={"role": "assistant", "content": "ok"})
    m2 = _msgs("agent", ("user", "do it"), ("assistant", "ok"), ("user", "more"))
    r2 = rec("b", 2, [1, 5, 10, 20, EOS, 30], [21, EOS], messages=m2, tools=TOOLS,
             response_message={"role": "assistant", "content": "done"})
    summary = rec("c", 3, [1, 9, 10, 20, EOS, 30, 33], [70, EOS], tools=[],
                  messages=_msgs("summarise", ("user", "do it"), ("assistant", "ok"),
                                 ("user", "more"), ("assistant", "done"), ("user", "sum up")))
    traj = pm([summary, r2, r1])
    assert roles(traj) == ["main", "side"] and traj.stats["breaks"] == 0
