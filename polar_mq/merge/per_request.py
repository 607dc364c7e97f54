"""per_request: one trace per model call. The baseline every trainer understands; it repeats
the shared history in every trace, which is what prefix_merging avoids.

Tests: tests/merge/test_merge.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from polar_mq.merge.base import BuildResult
from polar_mq.merge.eos import resolve_eos
from polar_mq.merge.origins import analyse, annotate
from polar_mq.merge.records import Call, conversation_messages, prepare
from polar_mq.merge.stats import base_stats
from polar_mq.merge.versions import shifted
from polar_mq.model import CaptureRecord, Trace


@dataclass(frozen=True)
class PerRequestConfig:
    include_messages: bool = True  # False drops messages/tools from traces (smaller payloads)
    reward_scope: Literal["session", "split", "root"] = "session"  # see merge/rewards.py


def call_trace(call: Call, include_messages: bool = True) -> Trace:
    """A trace for one call: its prompt, its sampled tokens (all trainable) and their logprobs."""
    rec = call.record
    return Trace(
        prompt_ids=list(call.prompt),
        response_ids=list(call.completion),
        loss_mask=[1] * len(call.completion),
        response_logprobs=list(call.logprobs) if call.logprobs is not None else None,
        messages=conversation_messages(rec) if include_messages else [],
        tools=list(rec.tools or []) if include_messages else [],
        finish_reason=rec.finish_reason,
        call_ids=[rec.call_id],
        policy_versions=shifted([(0, rec)]),
    )


class PerRequestBuilder:
    name: ClassVar[str] = "per_request"
    Config: ClassVar[type] = PerRequestConfig

    def __init__(self, config: PerRequestConfig | None = None):
        self.config = config or PerRequestConfig()

    def build(self, records: list[CaptureRecord]) -> BuildResult:
        prep = prepare(records)
        traces = []
        for call in prep.calls:
            trace = call_trace(call, self.config.include_messages)
            trace.metadata = {"started_at": call.started_at, "truncated": call.truncated,
                              "aborted": call.aborted}
            traces.append(trace)
        # Lineage over the same conversations prefix_merging finds; trace i is call i.
        eos, _source = resolve_eos(prep.calls, None, True)
        an = analyse(prep.calls, eos, 0.5)
        lineage, lineage_stats = annotate(prep.calls, an, {c.index: c.index for c in prep.calls},
                                          len(traces))
        for trace, extra in zip(traces, lineage):
            trace.metadata.update(extra)
        stats = base_stats(prep, traces)
        stats.update(lineage_stats, reward_scope=self.config.reward_scope)
        return BuildResult(traces, stats)
