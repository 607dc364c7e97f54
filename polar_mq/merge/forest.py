"""The call forest: each call hangs under the call it continues.

A call's parent is the call whose prompt + sampled tokens is the longest prefix of its prompt
(with a strictly shorter prompt, so the relation is acyclic). This depends only on the token
ids, never on the order records arrived in. Calls with no such parent are roots: the start of a
conversation, a side call, a sub-agent, or a conversation resumed after a break.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from polar_mq.merge.lineage import recorded_parent
from polar_mq.merge.records import Call
from polar_mq.merge.trie import PrefixTrie


@dataclass
class Forest:
    calls: list[Call]
    parent: list[int | None]
    children: list[list[int]]  # in canonical order
    height: list[int]  # calls on the longest downward path, this call included
    size: list[int]  # calls in the subtree
    last_start: list[float]  # latest started_at in the subtree
    tokens: list[int]  # sampled tokens in the subtree

    @property
    def roots(self) -> list[int]:
        return [c.index for c in self.calls if self.parent[c.index] is None]

    def continuation_key(self, i: int) -> tuple[Any, ...]:
        """Which branch keeps the chain at a fork or retry: the one the conversation went on
        from (deepest, then largest, then most recent), ties broken by canonical order."""
        return (self.height[i], self.size[i], self.last_start[i], self.tokens[i], i)

    def heavy_child(self, i: int) -> int | None:
        kids = self.children[i]
        return max(kids, key=self.continuation_key) if kids else None


def _choose(candidates: list[int], child: Call) -> int:
    """Several calls with the same prompt+completion (identical retries): the latest one
    started before the child, else the earliest."""
    before = [i for i in candidates if i < child.index]
    return max(before) if before else min(candidates)


def find_parents(calls: list[Call]) -> list[int | None]:
    """Insert shortest first: every possible parent of a call has a whole sequence no longer
    than the call's prompt, so it is already in the trie when the call's own insertion walks
    past it, and one walk per call both stores it and finds its parent."""
    trie = PrefixTrie()
    parent: list[int | None] = [None] * len(calls)
    by_id = {c.call_id: c for c in calls}
    for call in sorted(calls, key=lambda c: (len(c.full), c.index)):
        found = trie.insert(call.full, call.index, report_upto=len(call.prompt))
        recorded = recorded_parent(call, by_id)
        if recorded is not None:  # the gateway's own lineage (token-in continuation)
            parent[call.index] = recorded
            continue
        for _depth, keys in reversed(found):
            # the trie's keys here are call indexes (inserted above)
            cands = [k for k in cast("list[int]", keys) if len(calls[k].prompt) < len(call.prompt)]
            if cands:
                parent[call.index] = _choose(cands, call)
                break
    return parent


def build_forest(calls: list[Call]) -> Forest:
    parent = find_parents(calls)
    children: list[list[int]] = [[] for _ in calls]
    for i, p in enumerate(parent):
        if p is not None:
            children[p].append(i)
    n = len(calls)
    height, size = [1] * n, [1] * n
    last_start = [c.started_at for c in calls]
    tokens = [len(c.completion) for c in calls]
    # Children have strictly longer prompts than parents: longest prompts first is bottom-up.
    for i in sorted(range(n), key=lambda j: -len(calls[j].prompt)):
        p = parent[i]
        if p is not None:
            height[p] = max(height[p], height[i] + 1)
            size[p] += size[i]
            last_start[p] = max(last_start[p], last_start[i])
            tokens[p] += tokens[i]
    return Forest(calls, parent, children, height, size, last_start, tokens)
