"""Statistics every trajectory carries, computed the same way for every builder so that
``delivered_fraction`` of per_request and prefix_merging (and custom builders) compare."""

from __future__ import annotations

from typing import Any

from polar_mq.merge.records import Prepared
from polar_mq.model import Trace


def base_stats(prep: Prepared, traces: list[Trace]) -> dict[str, Any]:
    delivered = sum(sum(t.loss_mask) for t in traces)
    sampled = prep.sampled_tokens
    return {
        "calls": prep.records,
        "calls_used": len(prep.calls),
        "skipped": dict(sorted(prep.skipped.items())),
        "traces": len(traces),
        "sampled_tokens": sampled,
        "delivered_tokens": delivered,
        "delivered_fraction": round(delivered / sampled, 6) if sampled else 1.0,
        "total_tokens": sum(len(t.prompt_ids) + len(t.response_ids) for t in traces),
        "truncated_calls": sum(1 for c in prep.calls if c.truncated),
        "aborted_calls": sum(1 for c in prep.calls if c.aborted),
        "calls_without_logprobs": sum(1 for c in prep.calls if c.logprobs is None),
    }
