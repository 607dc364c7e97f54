"""Who is who in a session: the main conversation, side calls, sub-agents, retries and forks.

Harnesses make calls that are not part of the agent's main line of work: title generation,
routers, memory extraction (side calls) and delegated sub-agents. They must become their own
traces so they do not pollute the main one, and be labelled so a trainer can weight or drop
them. The heuristics: the main conversation is the one with the most calls; another
conversation with tools that makes several calls or calls a tool is a sub-agent; the rest are
side calls. The reasons are recorded alongside the label.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from polar_mq.merge.chains import Chain
from polar_mq.merge.messages import system_text
from polar_mq.merge.records import Call
from polar_mq.merge.trie import lcp

MAIN, SIDE, SUBAGENT, RETRY, FORK = "main", "side", "subagent", "retry", "fork"


@dataclass
class Conversation:
    id: int
    chains: list[int] = field(default_factory=list)
    calls: list[int] = field(default_factory=list)  # canonical order
    role: str = MAIN
    reasons: list[str] = field(default_factory=list)
    spawned_by: int | None = None  # the main-conversation call running when it started

    def score(self, calls: list[Call]) -> tuple[Any, ...]:
        tokens = sum(len(calls[i].completion) for i in self.calls)
        return (len(self.calls), tokens, -self.calls[0])


def _uses_tools(calls: list[Call], idx: list[int]) -> tuple[bool, bool]:
    has_tools = any(calls[i].record.tools for i in idx)
    called = any((calls[i].record.finish_reason == "tool_calls")
                 or bool((calls[i].record.response_message or {}).get("tool_calls"))
                 for i in idx)
    return has_tools, called


def label_roles(chains: list[Chain], convs: list[Conversation], calls: list[Call]) -> None:
    if not convs:
        return
    main = max(convs, key=lambda c: c.score(calls))
    main.role, main.reasons = MAIN, ["most calls"]
    main_first = calls[main.calls[0]]
    main_has_tools, _ = _uses_tools(calls, main.calls)
    main_system = system_text(main_first.record)
    prompt_lens = sorted(len(calls[i].prompt) for i in main.calls)
    main_median = prompt_lens[len(prompt_lens) // 2]
    for conv in convs:
        if conv is main:
            continue
        first = calls[conv.calls[0]]
        has_tools, called = _uses_tools(calls, conv.calls)
        reasons = []
        if main_has_tools and not has_tools:
            reasons.append("no tools")
        if main_system and system_text(first.record) != main_system:
            reasons.append("different system prompt")
        if lcp(first.prompt, main_first.prompt) < 0.5 * min(len(first.prompt), len(main_first.prompt)):
            reasons.append("shares no prefix with main")
        if len(first.prompt) < 0.5 * main_median:
            reasons.append("short prompt")
        if has_tools and (len(conv.calls) > 1 or called):
            conv.role = SUBAGENT
            reasons.append("own tool-using conversation")
        else:
            conv.role = SIDE
        conv.reasons = reasons
        earlier = [i for i in main.calls if i < first.index]
        conv.spawned_by = earlier[-1] if earlier else None
    for chain in chains:
        conv = convs[chain.conversation]
        if chain.origin == "retry":
            chain.role, chain.role_reason = RETRY, "same prompt sent again; another copy was kept"
        elif chain.origin == "fork":
            chain.role, chain.role_reason = FORK, "another continuation of the same history was kept"
        elif chain.origin == "break":
            chain.role = conv.role
            chain.role_reason = "the conversation went on past this turn, re-tokenised"
        else:
            chain.role, chain.role_reason = conv.role, ", ".join(conv.reasons)
