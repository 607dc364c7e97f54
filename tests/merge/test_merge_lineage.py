"""Sub-agents and compaction as the real CLIs do them, kept as a tree (CONTRACT "Agent lineage and
versions per token"): records rendered with the stand-in tokenizer, whose messages follow the
pinned CLIs' requests (tool names and schemas from tests/replays, the compaction texts from the
CLIs' sources: polar_mq/merge/agents.py). Lineage must not depend on the order records arrive in.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polar_mq.merge import build, get_builder
from polar_mq.merge.rewards import assign_rewards
from polar_mq.merge.synthetic import SessionSim
from polar_mq.model import CaptureRecord, Trajectory
from polar_mq.taskspec import ValidationError, parse_task

tokenizer_mod = pytest.importorskip("polar_mq.dev.model_server.tokenizer")
TOK = tokenizer_mod.load_tokenizer()
REPLAYS = Path(__file__).resolve().parents[1] / "replays"
BUILDERS = ("prefix_merging", "per_request")


def _replay_tool(harness: str, api: str, name: str) -> dict[str, Any]:
    """The sub-agent tool's definition exactly as the pinned CLI sent it, as a function tool."""
    data = json.loads((REPLAYS / harness / f"{api}.json").read_text())
    body = next(r["body"] for r in data["requests"] if isinstance(r.get("body"), dict) and r["body"].get("tools"))
    for tool in body["tools"]:
        fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
        if fn.get("name") == name:
            return {"type": "function", "function": {"name": name, "description": fn.get("description", ""),
                                                     "parameters": fn.get("parameters") or fn.get("input_schema")}}
        # Codex's namespace multi_agent_v1; Gemini's functionDeclarations
        for sub in (tool.get("tools") or []) + (tool.get("functionDeclarations") or []):
            if sub.get("name") == name:
                params = sub.get("parameters") or sub.get("parametersJsonSchema")
                return {"type": "function", "function": {"name": name, "parameters": params}}
    raise AssertionError(f"{harness}/{api}: no tool {name!r} in the recorded request")


# harness -> (replay file, sub-agent tool, its arguments for a prompt, how the child's opening wraps it)
SUBAGENT = {
    "claude_code": ("anthropic", "Agent", lambda p: {"description": "Explore repo", "prompt": p,
                                                     "subagent_type": "general-purpose"},
                    lambda p: [{"role": "user", "content": "<system-reminder>\ncontext\n</system-reminder>\n\n\n" + p}]),
    "opencode": ("openai_chat", "task", lambda p: {"description": "Explore repo", "prompt": p,
                                                   "subagent_type": "explore"},
                 lambda p: [{"role": "user", "content": p}]),
    "qwen_code": ("openai_chat", "agent", lambda p: {"description": "Explore repo", "prompt": p,
                                                     "subagent_type": "Explore"},
                  lambda p: [{"role": "user", "content": p}]),
    "gemini_cli": ("gemini", "invoke_agent", lambda p: {"agent_name": "codebase_investigator", "prompt": p},
                   lambda p: [{"role": "user", "content": p}]),
    "codex": ("openai_responses", "spawn_agent", lambda p: {"message": p},
              lambda p: [{"role": "user", "content": "<environment_context>\n  <cwd>/w</cwd>\n</environment_context>"},
                         {"role": "user", "content": p}]),
}

SUMMARY = ("Primary request: write polar.txt with the word polar and check it with cat polar.txt "
           "before finishing the task")
# harness -> (summary request: system, last user text, whole history or serialised; continuation opening)
COMPACTION = {
    "claude_code": ("You are a helpful AI assistant tasked with summarizing conversations.",
                    "Your task is to create a detailed summary of the conversation so far, paying close "
                    "attention to the user's explicit requests and your previous actions.", True,
                    lambda s: [{"role": "user", "content": "This session is being continued from a previous "
                                "conversation that ran out of context. The summary below covers the earlier "
                                "portion of the conversation.\n\nSummary:\n" + s}]),
    "opencode": ("", "Here is the conversation so far:\n<conversation>\n[User]: ...\n</conversation>\nCreate a "
                 "new anchored summary from the conversation history in the <conversation> tags above so "
                 "another coding agent can continue the work.", False,
                 lambda s: [{"role": "user", "content": "What did we do so far?"},
                            {"role": "assistant", "content": s},
                            {"role": "user", "content": "Continue if you have next steps, or stop and ask "
                             "for clarification if you are unsure how to proceed."}]),
    "qwen_code": ("You are the component that summarizes internal chat history into a given structure.",
                  "First, reason in your scratchpad. Then, generate the <state_snapshot>.", True,
                  lambda s: [{"role": "user", "content": s},
                             {"role": "assistant", "content": "Got it. Thanks for the additional context!"},
                             {"role": "user", "content": "Continue with the prior task using the context above."}]),
    "gemini_cli": ("You are a specialized system component responsible for distilling chat history into a "
                   "structured XML <state_snapshot>.",
                   "First, reason in your scratchpad. Then, generate the updated <state_snapshot>.", True,
                   lambda s: [{"role": "user", "content": s},
                              {"role": "assistant", "content": "Got it. Thanks for the additional context!"}]),
    "codex": ("You are Codex.", "You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff summary "
              "for another LLM that will resume the task.", True,
              lambda s: [{"role": "user", "content": "Another language model started to solve this problem "
                          "and produced a summary of its thinking process. You also have access to the state "
                          "of the tools that were used by that language model.\n" + s}]),
    "pi": ("You are a context summarization assistant.", "The messages above are a conversation to summarize. "
           "Create a structured context checkpoint summary that another LLM will use to continue the work.", True,
           lambda s: [{"role": "user", "content": "The conversation history before this point was compacted "
                       "into the following summary:\n\n<summary>\n" + s + "\n</summary>"}]),
}


def subagent_session(harness: str, sim: SessionSim, prompt: str, *, sub_turns: int = 2) -> dict[str, Any]:
    """Main turn -> sub-agent tool call -> the child's conversation -> its answer back as the tool
    result -> main goes on. Returns the records' call ids by part."""
    api, name, args, opening = SUBAGENT[harness]
    tool = _replay_tool(harness, api, name)
    main = sim.conversation(system=f"You are {harness}.", user="Create the file polar.txt",
                            tools=[tool, BASH])
    first = sim.turn(main, tool_call=False, tool=None, advance=False)  # a retry of turn one
    spawn_answer = "the explorer found two files"
    parent = sim.turn(main, tool=(name, args(prompt)), result=spawn_answer)
    child = sim.conversation(system="You are a read-only explorer.", tools=[BASH])
    child.messages = opening(prompt)
    kids = [sim.turn(child) for _ in range(sub_turns - 1)]
    kids.append(sim.turn(child, tool_call=False, content=spawn_answer))
    back = sim.turn(main)
    return {"main": main, "retry": first, "parent": parent, "children": kids, "back": back,
            "tool_call_id": parent.response_message["tool_calls"][0]["id"]}


BASH = {"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}


def compaction_session(harness: str, sim: SessionSim) -> dict[str, Any]:
    system, ask, with_history, opening = COMPACTION[harness]
    main = sim.conversation(system=f"You are {harness}.", user="Create the file polar.txt", tools=[BASH])
    before = [sim.turn(main), sim.turn(main)]
    req = sim.conversation(system=system, tools=[])
    req.messages = (list(main.messages) if with_history else []) + [{"role": "user", "content": ask}]
    if not system:
        req.system = ""
    summary = sim.turn(req, tool_call=False, advance=False,
                       content=f"<analysis>thinking</analysis>\n<summary>\n{SUMMARY}\n</summary>")
    cont = sim.conversation(system=f"You are {harness}.", tools=[BASH])
    cont.messages = opening(SUMMARY)
    after = [sim.turn(cont), sim.turn(cont, tool_call=False)]
    return {"before": before, "summary": summary, "after": after}


def _trace_of(traj: Trajectory, call_id: str) -> int:
    return next(i for i, t in enumerate(traj.traces) if call_id in t.call_ids)


@pytest.mark.parametrize("builder", BUILDERS)
@pytest.mark.parametrize("harness", sorted(SUBAGENT))
def test_a_subagent_names_the_tool_call_that_started_it(harness: str, builder: str) -> None:
    sim = SessionSim(TOK, seed=3, session_id=harness)
    prompt = "List every Python file under src/ and say which one defines the parser."
    s = subagent_session(harness, sim, prompt)
    traj = build(builder, sim.records, session_id=harness)
    parent_t = _trace_of(traj, s["parent"].call_id)
    expected = {"trace_index": parent_t, "call_id": s["parent"].call_id,
                "tool_call_id": s["tool_call_id"], "tool": SUBAGENT[harness][1]}
    child_traces = {_trace_of(traj, k.call_id) for k in s["children"]}
    for t in child_traces:
        assert traj.traces[t].metadata["spawned_by"] == expected
        assert traj.traces[t].metadata["origin"] == "sub_agent" or builder == "per_request"
    assert traj.traces[min(child_traces)].metadata["origin"] == "sub_agent"
    spawned = traj.traces[parent_t].metadata["spawned"]
    assert spawned == [{"trace_index": min(child_traces), "tool_call_id": s["tool_call_id"],
                        "tool": SUBAGENT[harness][1], "result_call_id": s["back"].call_id,
                        "result_trace_index": _trace_of(traj, s["back"].call_id)}]
    others = [t for i, t in enumerate(traj.traces) if i not in child_traces]
    assert all("spawned_by" not in t.metadata for t in others)
    assert traj.stats["subagents"] == 1
    assert traj.stats["origins"]["sub_agent"] >= 1 and traj.stats["origins"]["retry"] == 1


def test_pi_has_no_subagent_tool_and_nothing_is_linked() -> None:
    """pi's recorded tools are bash/edit/read/write: a conversation opening with a bash command's
    text is not a sub-agent."""
    sim = SessionSim(TOK, seed=4, session_id="pi")
    main = sim.conversation(system="You are pi.", user="Create the file polar.txt", tools=[BASH])
    sim.turn(main, tool=("bash", {"prompt": "Summarise the repository layout in detail please"}))
    other = sim.conversation(system="Title", tools=[], user="Summarise the repository layout in detail please")
    sim.turn(other, tool_call=False)
    traj = build("prefix_merging", sim.records, session_id="pi")
    assert all("spawned_by" not in t.metadata for t in traj.traces)
    assert traj.stats["subagents"] == 0


@pytest.mark.parametrize("builder", BUILDERS)
@pytest.mark.parametrize("harness", sorted(COMPACTION))
def test_a_chain_after_compaction_continues_from_the_summary_call(harness: str, builder: str) -> None:
    sim = SessionSim(TOK, seed=5, session_id=harness)
    s = compaction_session(harness, sim)
    traj = build(builder, sim.records, session_id=harness)
    summary_t = _trace_of(traj, s["summary"].call_id)
    summary = traj.traces[summary_t]
    assert summary.metadata["origin"] == "summary"
    assert sum(summary.loss_mask) == len(s["summary"].completion_token_ids)  # kept, trainable
    before_t = _trace_of(traj, s["before"][-1].call_id)
    assert summary.metadata["compaction_summary"] == {
        "call_id": s["summary"].call_id,
        "summarized_trace_index": before_t if COMPACTION[harness][2] else None}
    for rec in s["after"]:
        t = traj.traces[_trace_of(traj, rec.call_id)]
        assert t.metadata["continues_from"] == {"trace_index": summary_t, "reason": "compaction"}
    assert traj.traces[_trace_of(traj, s["after"][0].call_id)].metadata["origin"] == "compaction"
    assert "continues_from" not in traj.traces[before_t].metadata
    assert traj.stats["compactions"] == 1
    assert traj.stats["origins"]["summary"] == 1


def test_identical_prompts_go_to_their_children_in_start_order() -> None:
    sim = SessionSim(TOK, seed=6, session_id="twice")
    prompt = "Run the test suite and report the failing tests by name."
    a = subagent_session("claude_code", sim, prompt)
    b_parent = sim.turn(a["main"], tool=("Agent", {"prompt": prompt, "description": "again"}))
    child = sim.conversation(system="You are a read-only explorer.", tools=[BASH])
    child.messages = [{"role": "user", "content": prompt}]
    b_kid = sim.turn(child, tool_call=False, content="all green now")
    traj = build("prefix_merging", sim.records, session_id="twice")
    first = traj.traces[_trace_of(traj, a["children"][0].call_id)].metadata["spawned_by"]
    second = traj.traces[_trace_of(traj, b_kid.call_id)].metadata["spawned_by"]
    assert first["call_id"] == a["parent"].call_id
    assert second["call_id"] == b_parent.call_id


def _lineage(traj: Trajectory) -> list[tuple[Any, ...]]:
    """Lineage keyed by call ids (trace indices are canonical, so they must match too)."""
    keys = ("spawned_by", "spawned", "continues_from", "compaction_summary", "origin")
    return [(tuple(t.call_ids), json.dumps({k: t.metadata.get(k) for k in keys}, sort_keys=True))
            for t in traj.traces]


def random_session(seed: int, ops: list[str]) -> list[CaptureRecord]:
    sim = SessionSim(TOK, seed=seed, session_id=f"r{seed}")
    harnesses = sorted(SUBAGENT)
    for op in ops:
        harness = harnesses[sim.rng.randrange(len(harnesses))]
        if op == "sub":
            subagent_session(harness, sim, f"Investigate module {sim.words(4)} and report its callers.",
                             sub_turns=sim.rng.randint(1, 3))
        else:
            compaction_session(harness, sim)
    return sim.records


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), ops=st.lists(st.sampled_from(["sub", "compact"]), min_size=1, max_size=3),
       order=st.randoms(use_true_random=False), builder=st.sampled_from(BUILDERS),
       same_time=st.booleans())
def test_lineage_never_depends_on_arrival_order(seed: int, ops: list[str], order: random.Random,
                                                 builder: str, same_time: bool) -> None:
    records = random_session(seed, ops)
    if same_time:  # clock ties between neighbours: the call id decides, never the arrival
        for before, r in zip(records[::2], records[1::2]):
            r.started_at = before.started_at
    expected = _lineage(build(builder, records, session_id="x"))
    shuffled = list(records)
    order.shuffle(shuffled)
    dup = [CaptureRecord.from_dict(r.to_dict()) for r in shuffled[: len(shuffled) // 3]]
    assert _lineage(build(builder, shuffled + dup, session_id="x")) == expected
    traj = build(builder, records, session_id="x")
    assert traj.stats["subagents"] == ops.count("sub")
    assert traj.stats["compactions"] == ops.count("compact")


def test_reward_scopes() -> None:
    sim = SessionSim(TOK, seed=7, session_id="rw")
    subagent_session("opencode", sim, "Find the configuration loader and explain its defaults.")
    for scope, check in (
        ("session", lambda t, r: r == 1.0),
        ("split", lambda t, r: r == pytest.approx(1.0 / n)),
        ("root", lambda t, r: r == (0.0 if t.metadata.get("spawned_by") else 1.0)),
    ):
        traj = build("prefix_merging", sim.records, {"reward_scope": scope}, session_id="rw")
        assert traj.stats["reward_scope"] == scope
        n = len(traj.traces)
        traj.reward = 1.0
        assign_rewards(traj)
        assert all(check(t, t.reward) for t in traj.traces), scope
        assert any(t.metadata.get("spawned_by") for t in traj.traces)
    traj.reward = None
    assign_rewards(traj)
    assert all(t.reward is None for t in traj.traces)


@pytest.mark.parametrize("builder", BUILDERS)
def test_a_bad_reward_scope_is_refused_at_submit(builder: str) -> None:
    with pytest.raises(ValueError, match="reward_scope"):
        get_builder(builder, {"reward_scope": "everyone"})
    task = {"instruction": "x", "agent": {"harness": "codex"},
            "builder": {"strategy": builder, "config": {"reward_scope": "everyone"}}}
    with pytest.raises(ValidationError) as err:
        parse_task(task)
    assert err.value.field == "builder.config.reward_scope"
    task["builder"]["config"] = {"reward_scope": "split"}
    assert parse_task(task).builder.config == {"reward_scope": "split"}
