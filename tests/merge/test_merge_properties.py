"""Property tests: simulated multi-turn sessions rendered with the real stand-in tokenizer and chat
template, with retries, forks, truncations, drift, template changes, side calls, sub-agents,
failed calls and shuffled arrival order. Whatever the session, every sampled token must be
delivered exactly once, trainable, with its own logprob, in a trace whose sequence is the real
sequence of its last call."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polar_mq.merge import build
from polar_mq.merge.synthetic import SessionSim
from polar_mq.model import CaptureRecord, Trajectory

tokenizer_mod = pytest.importorskip("polar_mq.dev.model_server.tokenizer")
TOK = tokenizer_mod.load_tokenizer()
ROLES = {"main", "side", "subagent", "retry", "fork"}

LINEAR_OPS = ["turn", "turn", "chat", "no_eos", "no_logprobs"]
EVENT_OPS = LINEAR_OPS + ["truncate", "retry", "fork", "drift", "template_change", "side",
                          "subagent", "sub_step", "failed"]
SETTINGS = settings(max_examples=50, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


def simulate(ops: list[str], seed: int) -> list[CaptureRecord]:
    sim = SessionSim(TOK, seed=seed, session_id=f"s{seed}")
    main = sim.conversation()
    subs = []
    sim.turn(main)
    for op in ops:
        if op == "turn":
            sim.turn(main)
        elif op == "chat":
            sim.turn(main, tool_call=False)
        elif op == "no_eos":
            sim.turn(main, no_eos=True)
        elif op == "no_logprobs":
            sim.turn(main, logprobs=False)
        elif op == "truncate":
            sim.turn(main, truncate=True)
        elif op == "drift":
            sim.turn(main, drift=True)
        elif op == "retry":
            sim.turn(main, advance=False)
        elif op == "fork":
            branch = main.fork()  # the same history with a different last tool result
            branch.messages[-1] = {**branch.messages[-1], "content": sim.words(5)}
            for _ in range(sim.rng.randint(1, 2)):
                sim.turn(branch)
        elif op == "template_change":
            main.system = f"You are a coding agent. (request {sim.rng.randint(0, 999)})"
        elif op == "side":
            title = sim.conversation(system="Write a five-word title.", tools=[],
                                     user=main.messages[0]["content"])
            sim.turn(title, tool_call=False, advance=False)
        elif op == "subagent":
            subs.append(sim.conversation(system="You are a read-only explorer sub-agent."))
            sim.turn(subs[-1])
        elif op == "sub_step" and subs:
            sim.turn(sim.rng.choice(subs))
        elif op == "failed":
            sim.failed(main)
    sim.turn(main)
    return sim.records


def check_delivery(records: list[CaptureRecord], traj: Trajectory) -> None:
    ok = {r.call_id: r for r in records if r.status == "ok"}
    seen = Counter(cid for t in traj.traces for cid in t.call_ids)
    assert set(seen) == set(ok) and all(n == 1 for n in seen.values()), "calls lost or repeated"
    for t in traj.traces:
        assert len(t.loss_mask) == len(t.response_ids)
        assert t.response_logprobs is None or len(t.response_logprobs) == len(t.response_ids)
        calls = [ok[cid] for cid in t.call_ids]
        first, last = calls[0], calls[-1]
        assert t.prompt_ids == first.prompt_token_ids
        assert t.prompt_ids + t.response_ids == last.prompt_token_ids + last.completion_token_ids
        full = t.prompt_ids + t.response_ids
        trainable = [0] * len(t.prompt_ids) + t.loss_mask
        lps = None if t.response_logprobs is None else [0.0] * len(t.prompt_ids) + t.response_logprobs
        expected_mask = [0] * len(full)
        for r in calls:
            start, n = len(r.prompt_token_ids), len(r.completion_token_ids)
            assert full[:start] == r.prompt_token_ids, "context differs from the call's prompt"
            assert full[start:start + n] == r.completion_token_ids
            expected_mask[start:start + n] = [1] * n
            if lps is not None:
                assert lps[start:start + n] == r.completion_logprobs
            else:
                assert any(not c.completion_logprobs for c in calls)
        assert trainable == expected_mask, "mask-1 exactly on sampled tokens"
        if lps is not None:
            assert all(lp == 0.0 for lp, m in zip(lps, trainable) if not m)
    assert traj.stats["delivered_fraction"] == 1.0
    assert traj.stats["delivered_tokens"] == sum(len(r.completion_token_ids) for r in ok.values())


@SETTINGS
@given(ops=st.lists(st.sampled_from(EVENT_OPS), max_size=10), seed=st.integers(0, 10_000),
       shuffle_seed=st.integers(0, 10_000))
def test_every_sampled_token_delivered_once_and_order_does_not_matter(ops, seed, shuffle_seed):
    records = simulate(ops, seed)
    merged = build("prefix_merging", records, session_id="s")
    check_delivery(records, merged)
    check_delivery(records, build("per_request", records, session_id="s"))
    shuffled = list(records)
    random.Random(shuffle_seed).shuffle(shuffled)
    as_dicts = [r.to_dict() for r in shuffled]
    assert build("prefix_merging", as_dicts, session_id="s").to_dict() == merged.to_dict()
    per_request = build("per_request", records, session_id="s")
    assert build("per_request", as_dicts, session_id="s").to_dict() == per_request.to_dict()
    assert len(merged.traces) <= len(per_request.traces)
    assert {t.metadata["role"] for t in merged.traces} <= ROLES
    assert merged.traces[0].metadata["role"] == "main"  # the session starts in the main line
    # Labels follow the events that were simulated.
    role_count = Counter(t.metadata["role"] for t in merged.traces)
    assert role_count["side"] <= ops.count("side")
    assert role_count["subagent"] <= ops.count("subagent")
    # identical side calls (the same title prompt twice) are retries of one another
    assert merged.stats["retries"] <= ops.count("retry") + ops.count("side")
    if "subagent" not in ops:
        assert merged.stats["conversations"] <= 1 + ops.count("side")


@SETTINGS
@given(ops=st.lists(st.sampled_from(LINEAR_OPS), max_size=8), seed=st.integers(0, 10_000))
def test_a_plain_session_is_one_main_trace(ops, seed):
    records = simulate(ops, seed)
    traj = build("prefix_merging", records, session_id="s")
    assert len(traj.traces) == 1 and traj.traces[0].metadata["role"] == "main"
    assert traj.stats["breaks"] == 0 and traj.stats["eos_token_id"] == TOK.eos_token_id
    assert traj.stats["eos_inserted"] == ops.count("no_eos")


@SETTINGS
@given(ops=st.lists(st.sampled_from(LINEAR_OPS + ["truncate"] * 3), max_size=8),
       seed=st.integers(0, 10_000))
def test_truncated_turns_stay_in_the_main_line(ops, seed):
    """A truncated answer is re-rendered from its text; the end-of-turn token and any
    re-tokenisation of the cut word show up as mask-0 glue or, at worst, a drift break."""
    records = simulate(ops, seed)
    traj = build("prefix_merging", records, session_id="s")
    check_delivery(records, traj)
    assert {t.metadata["role"] for t in traj.traces} == {"main"}
    assert set(traj.stats["break_kinds"]) <= {"retokenization_drift"}
    assert len(traj.traces) == 1 + traj.stats["breaks"]
    assert traj.stats["truncated_calls"] == ops.count("truncate")
    assert traj.stats["eos_inserted"] >= ops.count("no_eos")


@SETTINGS
@given(seed=st.integers(0, 10_000), turns=st.integers(1, 4))
def test_side_calls_subagents_retries_are_separated_and_labelled(seed, turns):
    sim = SessionSim(TOK, seed=seed)
    main = sim.conversation()
    for _ in range(turns):
        sim.turn(main)
    title = sim.conversation(system="Write a five-word title.", tools=[])
    sim.turn(title, tool_call=False, advance=False)
    sub = sim.conversation(system="You are a read-only explorer sub-agent.")
    sim.turn(sub)
    sim.turn(main, advance=False)  # client retry, abandoned
    sim.turn(sub)
    sim.turn(main)
    sim.turn(main)
    traj = build("prefix_merging", sim.records, session_id="s")
    check_delivery(sim.records, traj)
    assert sorted(t.metadata["role"] for t in traj.traces) == ["main", "retry", "side", "subagent"]
    main_trace = traj.traces[0]
    assert len(main_trace.call_ids) == turns + 2


@SETTINGS
@given(seed=st.integers(0, 10_000), turns=st.integers(0, 3), after=st.integers(1, 3),
       kind=st.sampled_from(["drift", "template_change"]))
def test_a_break_starts_a_new_main_trace_and_keeps_the_rest(seed, turns, after, kind):
    sim = SessionSim(TOK, seed=seed)
    main = sim.conversation()
    for _ in range(turns):
        sim.turn(main)
    if kind == "drift":
        sim.turn(main, drift=True)
    else:
        sim.turn(main)
        main.system = "You are a coding agent. (request 2)"
    for _ in range(after):
        sim.turn(main)
    traj = build("prefix_merging", sim.records, session_id="s")
    check_delivery(sim.records, traj)
    assert [t.metadata["role"] for t in traj.traces] == ["main", "main"]
    expected = "retokenization_drift" if kind == "drift" else "template_change"
    assert traj.stats["break_kinds"] == {expected: 1}


@SETTINGS
@given(seed=st.integers(0, 10_000), chat=st.booleans())
def test_single_call_sessions_are_identical_with_both_builders(seed, chat):
    sim = SessionSim(TOK, seed=seed)
    sim.turn(sim.conversation(tools=[] if chat else None), tool_call=not chat)
    a = build("per_request", sim.records, session_id="s").to_dict()
    b = build("prefix_merging", sim.records, session_id="s").to_dict()
    for traj in (a, b):
        for trace in traj["traces"]:
            trace.pop("metadata")
    assert a["traces"] == b["traces"]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(seqs=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=8), min_size=1, max_size=12),
       probe=st.lists(st.integers(0, 3), max_size=10), order_seed=st.integers(0, 1000))
def test_trie_matches_brute_force(seqs, probe, order_seed):
    from polar_mq.merge.trie import PrefixTrie
    order = list(range(len(seqs)))
    random.Random(order_seed).shuffle(order)
    trie = PrefixTrie()
    for i in order:
        upto = len(seqs[i]) - 1
        reported = {(d, k) for d, keys in trie.insert(seqs[i], i, report_upto=upto) for k in keys}
        inserted = order[:order.index(i)]
        assert reported == {(len(seqs[j]), j) for j in inserted
                            if len(seqs[j]) <= upto and seqs[i][:len(seqs[j])] == seqs[j]}
    found = {(d, k) for d, keys in trie.prefixes_of(probe) for k in keys}
    assert found == {(len(s), j) for j, s in enumerate(seqs) if probe[:len(s)] == s}
