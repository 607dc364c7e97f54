"""Linking a chain that starts after a prefix break back to the conversation it resumes.

A root chain is either a new conversation (side call, sub-agent, first call) or the same
conversation after the token prefix broke. The resumed conversation is found by messages when
the records carry them (the earlier call's dialogue plus its answer is a prefix of this call's
dialogue), else by tokens (the prompt shares most of an earlier prompt and is longer than that
call's whole sequence). The kind of break is read from where the tokens diverge.

Tests: tests/merge/test_merge.py, tests/merge/test_merge_properties.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from polar_mq.merge.messages import dialogue_keys, system_text
from polar_mq.merge.records import Call
from polar_mq.merge.trie import lcp

TEMPLATE_CHANGE = "template_change"  # diverges inside an earlier prompt: history re-rendered
RETOKENIZATION_DRIFT = "retokenization_drift"  # diverges inside the earlier sampled tokens
EOS_MISMATCH = "eos_mismatch"  # diverges exactly at the sampled end-of-turn token


@dataclass(frozen=True)
class BreakLink:
    partner: int  # the earlier call this root resumes
    kind: str
    shared_tokens: int


def classify(call: Call, partner: Call, eos_token_id: int | None) -> tuple[str, int]:
    shared = lcp(call.prompt, partner.full)
    if shared < len(partner.prompt):
        return TEMPLATE_CHANGE, shared
    full = partner.full
    if eos_token_id is not None and shared == len(full) - 1 and full[-1] == eos_token_id:
        return EOS_MISMATCH, shared
    return RETOKENIZATION_DRIFT, shared


def _tool_names(call: Call) -> list[str]:
    names = []
    for tool in call.record.tools or []:
        fn: dict[str, Any] = tool["function"] if isinstance(tool.get("function"), dict) else tool
        names.append(str(fn.get("name")))
    return sorted(names)


def _same_agent(call: Call, other: Call) -> bool:
    """A changed system header or tool list alone is a template change; both changed means
    another agent replaying the history (compaction, memory extraction): a side call."""
    return (system_text(call.record) == system_text(other.record)
            or _tool_names(call) == _tool_names(other))


class BreakFinder:
    def __init__(self, calls: list[Call], eos_token_id: int | None, min_shared_fraction: float):
        self.calls = calls
        self.eos = eos_token_id
        self.min_shared = min_shared_fraction
        self._keys: dict[tuple[int, bool], list[tuple[Any, ...]]] = {}

    def _dialogue(self, i: int, with_response: bool) -> list[tuple[Any, ...]]:
        key = (i, with_response)
        if key not in self._keys:
            self._keys[key] = dialogue_keys(self.calls[i].record, with_response)
        return self._keys[key]

    def _candidates(self, call: Call, exclude: set[int]) -> list[Call]:
        """Earlier calls (canonical order) whose prompt is not an extension of this prompt."""
        out = []
        for other in self.calls[:call.index]:
            if other.index in exclude:
                continue
            if len(other.prompt) >= len(call.prompt) and \
                    other.prompt[:len(call.prompt)] == call.prompt:
                continue
            out.append(other)
        return out

    def _by_messages(self, call: Call, cands: list[Call]) -> Call | None:
        mine = self._dialogue(call.index, False)
        best, best_len = None, 0
        for other in cands:
            if not other.record.messages or not other.record.response_message:
                continue
            if not _same_agent(call, other):
                continue
            theirs = self._dialogue(other.index, True)
            if len(theirs) < 2 or len(theirs) > len(mine) or mine[:len(theirs)] != theirs:
                continue
            if len(theirs) >= best_len:  # later calls win ties
                best, best_len = other, len(theirs)
        return best

    def _by_tokens(self, call: Call, cands: list[Call], have_messages: bool) -> Call | None:
        best, best_shared = None, -1
        for other in cands:
            if other.prompt[0] != call.prompt[0]:
                continue
            shared = lcp(call.prompt, other.full)
            if shared >= best_shared:
                best, best_shared = other, shared
        if best is None:
            return None
        if best_shared >= len(best.prompt):  # diverges inside the sampled tokens: strong evidence
            return best
        if have_messages:
            return None
        if best_shared >= self.min_shared * len(best.prompt) and len(call.prompt) >= len(best.full):
            return best
        return None

    def find(self, call: Call, exclude: set[int]) -> BreakLink | None:
        cands = self._candidates(call, exclude)
        if not cands:
            return None
        have_messages = bool(call.record.messages)
        partner = self._by_messages(call, cands) if have_messages else None
        if partner is None:
            partner = self._by_tokens(call, cands, have_messages)
        if partner is None:
            return None
        kind, shared = classify(call, partner, self.eos)
        return BreakLink(partner.index, kind, shared)
