"""Cutting the call forest into chains, one trace each, without dropping any call.

From every start (a root, or a child that did not continue its parent's chain) the chain
follows the continuing child down. Every call lands in exactly one chain, so every sampled token
is delivered once, always in a trace whose context before it is exactly the prompt it was
sampled from. A non-continuing child is labelled by how it relates to the kept sibling: a
*retry* (same prompt, abandoned), a *break* (the conversation went on past it but re-tokenised
its answer) or a *fork* (another continuation of the same history).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

from polar_mq.merge.breaks import classify
from polar_mq.merge.forest import Forest


@dataclass
class Chain:
    calls: list[int]  # call indices, each extending the previous one's prompt + completion
    origin: str  # root | fork | retry | break
    branch_call: int | None = None  # the call this chain branches off (its tree parent)
    sibling: int | None = None  # for retries and forks of a same-prompt group: the kept call
    # Filled in by later stages:
    conversation: int = -1
    break_kind: str | None = None
    continues: int | None = None  # chain this one resumes after a break
    role: str = "main"
    role_reason: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def first(self) -> int:
        return self.calls[0]


def _follow(forest: Forest, start: int) -> list[int]:
    path = [start]
    nxt = forest.heavy_child(start)
    while nxt is not None:
        path.append(nxt)
        nxt = forest.heavy_child(nxt)
    return path


def _starts_with(seq: list[int], prefix: list[int]) -> bool:
    return len(seq) > len(prefix) and seq[:len(prefix)] == prefix


# (first call, origin, branch call, kept sibling, break kind) of a chain to cut
_Start = tuple[int, str, "int | None", "int | None", "str | None"]


def _label_siblings(forest: Forest, group: list[int], keep: int | None, eos: int | None
                    ) -> Iterator[tuple[int, str, int | None, str | None]]:
    """Yield (call, origin, repeated sibling, break kind) for every member of a sibling group that
    starts a chain of its own. ``keep`` continues the parent's chain (None for roots, which are
    siblings under an imaginary empty call: each distinct prompt starts its own chain).

    - same prompt as a kept sibling: ``retry`` when nothing continued from it, else ``fork``;
    - the kept sibling's prompt extends this call's prompt but not its sampled tokens: the
      conversation went on past this turn after re-tokenising it (``break``, drift kind);
    - otherwise another continuation of the same history: ``fork``.
    """
    calls = forest.calls
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for i in group:
        by_prompt.setdefault(tuple(calls[i].prompt), []).append(i)
    for same in by_prompt.values():
        kept = keep if keep in same else max(same, key=forest.continuation_key)
        for i in same:
            if i == keep:
                continue
            if i != kept:
                yield i, ("retry" if forest.height[i] == 1 else "fork"), kept, None
            elif keep is None:
                yield i, "root", None, None
            elif _starts_with(calls[keep].prompt, calls[i].prompt):
                yield i, "break", None, classify(calls[keep], calls[i], eos)[0]
            else:
                yield i, "fork", None, None


def cut_chains(forest: Forest, eos: int | None = None) -> list[Chain]:
    starts: list[_Start] = [(i, o, None, sib, kind) for i, o, sib, kind in
              _label_siblings(forest, forest.roots, None, eos)]
    for p, kids in enumerate(forest.children):
        if len(kids) > 1:
            heavy = forest.heavy_child(p)
            starts += [(i, o, p, sib, kind) for i, o, sib, kind in
                       _label_siblings(forest, kids, heavy, eos)]
    starts.sort(key=lambda s: s[0])
    return [Chain(_follow(forest, i), origin, branch, sib, break_kind=kind)
            for i, origin, branch, sib, kind in starts]
