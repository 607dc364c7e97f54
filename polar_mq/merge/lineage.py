"""The gateway's own lineage of calls (token-in continuation) as the builders use it.

With TITO each record names the call its conversation extends (`parent_call_id`) and says
whether its prompt was built from that call's recorded ids (`tito`) or why not (`tito_reason`).
The token prefix alone cannot tell identical siblings apart (a retry and its original have the
same prompt + sampled ids); the recorded parent can, so the call forest follows it whenever the
parent's sequence really is a prefix of the child's prompt. The counts per reason are the drift
statistics a user reads per session (and, summed, per harness).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable

from polar_mq.merge.records import Call
from polar_mq.model import CaptureRecord


def recorded_parent(call: Call, by_id: dict[str, Call]) -> int | None:
    """The index of the call this one's record names as its parent, when its whole sequence is a
    strict prefix of this call's prompt (else None: the token prefix decides)."""
    pid = call.record.parent_call_id
    parent = by_id.get(pid) if pid else None
    if parent is None or parent.index == call.index:
        return None
    full = parent.full
    if len(full) < len(call.prompt) and call.prompt[:len(full)] == full:
        return parent.index
    return None


def tito_stats(records: Iterable[CaptureRecord]) -> dict[str, Any]:
    """Generations continued by tokens, and those that were not, by reason."""
    latest: dict[str, CaptureRecord] = {}
    for rec in records:
        if rec.kind == "generation":
            latest[rec.call_id] = rec
    reasons: Counter[str] = Counter()
    continued = 0
    for rec in latest.values():
        if rec.tito:
            continued += 1
        else:
            reasons[rec.tito_reason or "unknown"] += 1
    return {"calls": len(latest), "continued": continued, "not_continued": dict(sorted(reasons.items()))}
