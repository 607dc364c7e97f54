"""Where each trace comes from: the session as a tree of conversations.

Both builders label their traces here (CONTRACT "Agent lineage and versions per token"):
- ``metadata.spawned_by = {"trace_index", "call_id", "tool_call_id", "tool"}`` on every trace of a
  sub-agent's conversation (the trace and tool call that started it), and on the parent trace
  ``metadata.spawned = [{"trace_index", "tool_call_id", "tool", "result_call_id",
  "result_trace_index"}]`` (the child, and the call that got its result back);
- ``metadata.continues_from = {"trace_index", "reason": "compaction"}`` on every trace of a
  conversation that starts from a summary (trace_index: the trace holding the summary call), and
  ``metadata.compaction_summary = {"summarized_trace_index"}`` on the summary's trace;
- ``metadata.origin``: root | sub_agent | compaction | summary | retry | fork | edit; the counts
  are the trajectory's ``stats.origins``.
Conversations are the call forest's (forest.py, chains.py, conversations.py), so sub-agents and
compaction are linked by canonical call order only (tests/merge/test_merge_lineage.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from polar_mq.merge import agents
from polar_mq.merge.breaks import BreakFinder
from polar_mq.merge.chains import Chain, cut_chains
from polar_mq.merge.conversations import group, link_breaks
from polar_mq.merge.forest import build_forest
from polar_mq.merge.records import Call
from polar_mq.merge.roles import MAIN, SUBAGENT, Conversation, label_roles

ORIGINS = ("root", "sub_agent", "compaction", "summary", "retry", "fork", "edit")
from polar_mq.taskspec import REWARD_SCOPES  # noqa: E402,F401  (one list: the submit check reads it too)


@dataclass
class Analysis:
    chains: list[Chain]
    chain_of_call: dict[int, int]
    convs: list[Conversation]


def analyse(calls: list[Call], eos: int | None, min_shared_fraction: float) -> Analysis:
    """The call forest cut into chains, grouped into labelled conversations."""
    forest = build_forest(calls)
    chains = cut_chains(forest, eos)
    chain_of_call = {i: ci for ci, ch in enumerate(chains) for i in ch.calls}
    link_breaks(chains, BreakFinder(calls, eos, min_shared_fraction), chain_of_call)
    convs = group(chains, chain_of_call)
    label_roles(chains, convs, calls)
    return Analysis(chains, chain_of_call, convs)


def _chain_origin(chain: Chain) -> str:
    if chain.origin in ("retry", "fork"):
        return chain.origin
    if chain.origin == "break" or chain.continues is not None:
        return "edit"  # the history was re-rendered or re-tokenised: the conversation goes on
    return "root"


def annotate(calls: list[Call], an: Analysis, trace_of_call: dict[int, int],
             n_traces: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Per trace, the lineage keys to add to its metadata; and the session's counts."""
    meta: list[dict[str, Any]] = [{} for _ in range(n_traces)]
    chains = an.chains
    heads = {conv.id: calls[conv.calls[0]] for conv in an.convs if conv.calls}
    summaries = [c for c in calls if agents.is_summary_request(c)]
    summary_ids = {c.index for c in summaries}
    spawn_of = agents.link_spawns(heads.values(), agents.find_spawns(calls))
    resumed = agents.link_compactions([h for h in heads.values() if h.index not in summary_ids],
                                      summaries)
    traces_of_conv: dict[int, list[int]] = {}
    for conv in an.convs:
        traces_of_conv[conv.id] = sorted({trace_of_call[i] for i in conv.calls})
    for conv in an.convs:
        head = heads.get(conv.id)
        if head is None:
            continue
        spawn = spawn_of.get(head.index)
        if spawn is not None:
            parent_trace = trace_of_call[spawn.call]
            link = {"trace_index": parent_trace, "call_id": calls[spawn.call].call_id,
                    "tool_call_id": spawn.tool_call_id, "tool": spawn.tool}
            for t in traces_of_conv[conv.id]:
                meta[t]["spawned_by"] = dict(link)
            back = agents.result_call(calls, spawn)
            meta[parent_trace].setdefault("spawned", []).append({
                "trace_index": trace_of_call[head.index], "tool_call_id": spawn.tool_call_id,
                "tool": spawn.tool, "result_call_id": back.call_id if back else None,
                "result_trace_index": trace_of_call[back.index] if back else None})
            conv.role = SUBAGENT
            for ci in conv.chains:
                if chains[ci].origin not in ("retry", "fork"):
                    chains[ci].role = SUBAGENT
                    chains[ci].role_reason = f"started by {spawn.tool} tool call {spawn.tool_call_id}"
        summary = resumed.get(head.index)
        if summary is not None:
            for t in traces_of_conv[conv.id]:
                meta[t]["continues_from"] = {"trace_index": trace_of_call[summary.index],
                                             "reason": "compaction"}
            # The agent goes on after compaction: the main conversation stays main (a shorter
            # continuation would otherwise be labelled a side call and dropped by role filters).
            source = an.convs[chains[an.chain_of_call[summary.index]].conversation]
            if source.role == MAIN and conv.role != MAIN:
                conv.role = MAIN
                conv.reasons = ["continues the main conversation after compaction"]
                for ci in conv.chains:
                    if chains[ci].origin not in ("retry", "fork"):
                        chains[ci].role, chains[ci].role_reason = MAIN, conv.reasons[0]
    members: dict[int, list[int]] = {}
    for i, t in sorted(trace_of_call.items()):
        members.setdefault(t, []).append(i)
    for s in summaries:
        t = trace_of_call[s.index]
        if s.index != members[t][0]:  # the request extends its own trace (Claude Code)
            summarized: int | None = t
        else:
            before = agents.summarized_call(calls, s, summary_ids | set(members[t]))
            summarized = trace_of_call[before.index] if before else None
        meta[t]["compaction_summary"] = {"call_id": s.call_id, "summarized_trace_index": summarized}
    # The chain's own start first (a retry stays a retry), then what started its conversation.
    counts = {o: 0 for o in ORIGINS}
    for t in range(n_traces):
        first = members[t][0] if members.get(t) else None
        origin = "root" if first is None else _chain_origin(chains[an.chain_of_call[first]])
        m = meta[t]
        if origin == "root":
            if first in summary_ids:
                origin = "summary"
            elif "spawned_by" in m:
                origin = "sub_agent"
            elif "continues_from" in m:
                origin = "compaction"
        m["origin"] = origin
        counts[origin] += 1
    stats = {"origins": counts,
             "subagents": sum(1 for h in heads.values() if h.index in spawn_of),
             "compactions": len(summaries)}
    return meta, stats

