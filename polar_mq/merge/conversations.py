"""Grouping chains into conversations: a chain belongs to the conversation it branches from
(fork, retry) or resumes after a prefix break; any other root chain starts a conversation."""

from __future__ import annotations

from polar_mq.merge.breaks import BreakFinder
from polar_mq.merge.chains import Chain
from polar_mq.merge.roles import Conversation


def link_breaks(chains: list[Chain], finder: BreakFinder, chain_of_call: dict[int, int]) -> None:
    calls = finder.calls
    for chain in chains:
        if chain.origin != "root":
            continue
        link = finder.find(calls[chain.first], set(chain.calls))
        if link is None:
            continue
        chain.break_kind = link.kind
        chain.continues = chain_of_call[link.partner]
        chain.extra["break_after_call_id"] = calls[link.partner].call_id
        chain.extra["break_shared_tokens"] = link.shared_tokens


def _target(chain: Chain, chain_of_call: dict[int, int]) -> int | None:
    if chain.sibling is not None:  # retry, or a fork that repeated a kept sibling's prompt
        return chain_of_call[chain.sibling]
    if chain.branch_call is not None:  # fork or break under a parent call
        return chain_of_call[chain.branch_call]
    return chain.continues  # a root: set when it resumes a conversation after a break


def group(chains: list[Chain], chain_of_call: dict[int, int]) -> list[Conversation]:
    owner: list[int | None] = [None] * len(chains)  # chain index that heads the conversation
    for start in range(len(chains)):
        path, seen, ci = [], set(), start
        while owner[ci] is None:
            path.append(ci)
            seen.add(ci)
            nxt = _target(chains[ci], chain_of_call)
            if nxt is None or nxt in seen:  # a head (or, with skewed clocks, a cycle: cut it)
                owner[ci] = ci
                break
            ci = nxt
        for p in path:
            owner[p] = owner[ci]
    heads = sorted({o for o in owner if o is not None}, key=lambda h: chains[h].first)
    number = {h: n for n, h in enumerate(heads)}
    convs = [Conversation(n) for n in range(len(heads))]
    for ci, chain in enumerate(chains):
        conv = convs[number[owner[ci]]]  # type: ignore[index]
        chain.conversation = conv.id
        conv.chains.append(ci)
        conv.calls.extend(chain.calls)
    for conv in convs:
        conv.calls.sort()
    return convs
