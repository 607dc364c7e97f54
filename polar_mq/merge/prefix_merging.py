"""prefix_merging: one trace per chain of calls that extend each other token by token.

A chain's trace is the first call's prompt, then for each call its sampled tokens (mask 1, real
logprobs) followed by the tokens the next prompt adds (tool results, template glue, an
end-of-turn token the sampled ids lacked: mask 0, logprob 0). Unlike the reference, the result
does not depend on arrival order, nothing is dropped at a break (the rest of the conversation
becomes another trace, labelled and linked), and side calls, sub-agents, retries and forks are
separated and labelled in ``trace.metadata``.

Tests: tests/merge/test_merge.py, tests/merge/test_merge_properties.py.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, ClassVar, Iterable, Literal, Mapping

from polar_mq.merge.base import BuildResult
from polar_mq.merge.chains import Chain
from polar_mq.merge.eos import resolve_eos
from polar_mq.merge.lineage import tito_stats
from polar_mq.merge.origins import analyse, annotate
from polar_mq.merge.records import Call, as_record, conversation_messages, prepare
from polar_mq.merge.roles import Conversation
from polar_mq.merge.versions import shifted
from polar_mq.merge.stats import base_stats
from polar_mq.model import CaptureRecord, Trace


@dataclass(frozen=True)
class PrefixMergingConfig:
    eos_token_id: int | None = None  # the template's end-of-turn token; inferred when None
    infer_eos: bool = True
    include_messages: bool = True  # False drops messages/tools from traces (smaller payloads)
    # Without messages to compare, a root whose prompt shares at least this fraction of an earlier
    # prompt (and is longer than that call's whole sequence) resumes its conversation.
    min_shared_fraction: float = 0.5
    # How the session's reward reaches its traces (merge/rewards.py): every trace, split
    # equally, or only the top-level agent's traces (sub-agents' get 0).
    reward_scope: Literal["session", "split", "root"] = "session"

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_shared_fraction <= 1.0:
            raise ValueError("config key 'min_shared_fraction' must be between 0 and 1")
        if self.eos_token_id is not None and self.eos_token_id < 0:
            raise ValueError("config key 'eos_token_id' must be a token id (>= 0)")


@dataclass
class _Assembled:
    trace: Trace
    interstitial: int
    eos_inserted: int


def assemble(chain: Chain, calls: list[Call], eos: int | None, include_messages: bool) -> _Assembled:
    """Lay the chain's calls end to end. Invariant: prompt + response == last call's full
    sequence, because each next prompt extends the previous call's full sequence."""
    members = [calls[i] for i in chain.calls]
    response: list[int] = []
    mask: list[int] = []
    logprobs: list[float] | None = []
    inter_total = eos_inserted = 0
    starts: list[tuple[int, CaptureRecord]] = []
    for k, call in enumerate(members):
        starts.append((len(response), call.record))
        response += call.completion
        mask += [1] * len(call.completion)
        if logprobs is not None and call.logprobs is not None:
            logprobs += call.logprobs
        else:
            logprobs = None
        if k + 1 < len(members):
            inter = members[k + 1].prompt[len(call.full):]
            response += inter
            mask += [0] * len(inter)
            if logprobs is not None:
                logprobs += [0.0] * len(inter)
            inter_total += len(inter)
            if eos is not None and inter and inter[0] == eos and call.completion[-1] != eos:
                eos_inserted += 1
    last = members[-1].record
    trace = Trace(
        prompt_ids=list(members[0].prompt),
        response_ids=response,
        loss_mask=mask,
        response_logprobs=logprobs,
        messages=conversation_messages(last) if include_messages else [],
        tools=list(last.tools or []) if include_messages else [],
        finish_reason=last.finish_reason,
        call_ids=[c.call_id for c in members],
        policy_versions=shifted(starts),
    )
    return _Assembled(trace, inter_total, eos_inserted)


def _metadata(chain: Chain, asm: _Assembled, calls: list[Call], conv: Conversation,
              chain_of_call: dict[int, int]) -> dict[str, Any]:
    """Labels and links; trace indices equal chain indices (both in canonical order)."""
    members = [calls[i] for i in chain.calls]
    meta: dict[str, Any] = {
        "role": chain.role,
        "role_reason": chain.role_reason,
        "conversation": conv.id,
        "conversation_role": conv.role,
        "calls": len(members),
        "sampled_tokens": sum(len(c.completion) for c in members),
        "interstitial_tokens": asm.interstitial,
        "eos_inserted": asm.eos_inserted,
        "truncated_calls": sum(1 for c in members if c.truncated),
        "aborted_calls": sum(1 for c in members if c.aborted),
        "aborted": any(c.aborted for c in members),
        "started_at": members[0].started_at,
        "parent_trace": None,
        "branch_call_id": None,
        "break": chain.break_kind,
        "continues_trace": None,
    }
    if chain.origin == "retry" or (chain.origin == "fork" and chain.sibling is not None):
        assert chain.sibling is not None, "a retry names the sibling it repeats"
        meta["parent_trace"] = chain_of_call[chain.sibling]
        meta["same_prompt_as_call_id"] = calls[chain.sibling].call_id
    elif chain.origin in ("fork", "break") and chain.branch_call is not None:
        meta["parent_trace"] = chain_of_call[chain.branch_call]
    if chain.branch_call is not None:
        meta["branch_call_id"] = calls[chain.branch_call].call_id
    if chain.continues is not None:
        meta["continues_trace"] = chain.continues
        meta.update(chain.extra)
    if chain.origin == "root" and chain.continues is None and conv.spawned_by is not None:
        meta["spawned_by_call_id"] = calls[conv.spawned_by].call_id
    return meta


class PrefixMergingBuilder:
    name: ClassVar[str] = "prefix_merging"
    Config: ClassVar[type] = PrefixMergingConfig

    def __init__(self, config: PrefixMergingConfig | None = None):
        self.config = config or PrefixMergingConfig()

    def build(self, records: list[CaptureRecord]) -> BuildResult:
        cfg = self.config
        prep = prepare(records)
        calls = prep.calls
        eos, eos_source = resolve_eos(calls, cfg.eos_token_id, cfg.infer_eos)
        an = analyse(calls, eos, cfg.min_shared_fraction)
        chains, chain_of_call, convs = an.chains, an.chain_of_call, an.convs
        lineage, lineage_stats = annotate(calls, an, chain_of_call, len(chains))
        traces: list[Trace] = []
        eos_inserted = 0
        for ci, chain in enumerate(chains):
            asm = assemble(chain, calls, eos, cfg.include_messages)
            asm.trace.metadata = _metadata(chain, asm, calls, convs[chain.conversation],
                                           chain_of_call)
            asm.trace.metadata.update(lineage[ci])
            eos_inserted += asm.eos_inserted
            traces.append(asm.trace)
        stats = base_stats(prep, traces)
        stats.update(_merge_stats(chains, convs, eos, eos_source, eos_inserted))
        stats["tito"] = tito_stats(prep_records(records))
        stats.update(lineage_stats, reward_scope=cfg.reward_scope)
        return BuildResult(traces, stats)


def prep_records(records: Iterable[CaptureRecord | Mapping[str, Any]]) -> list[CaptureRecord]:
    return [as_record(r) for r in records]


def _merge_stats(chains: list[Chain], convs: list[Conversation], eos: int | None,
                 eos_source: str, eos_inserted: int) -> dict[str, Any]:
    kinds: Counter[str] = Counter()
    for chain in chains:
        if chain.origin == "fork":
            kinds["fork"] += 1
        if chain.break_kind:
            kinds[chain.break_kind] += 1
    roles = Counter(chain.role for chain in chains)
    return {
        "breaks": sum(kinds.values()),
        "break_kinds": dict(sorted(kinds.items())),
        "retries": sum(1 for c in chains if c.origin == "retry"),
        "roles": dict(sorted(roles.items())),
        "conversations": len(convs),
        "eos_token_id": eos,
        "eos_source": eos_source,
        "eos_inserted": eos_inserted,
    }
