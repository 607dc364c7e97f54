"""Calls a dead gateway process took with it, and the calls that retried them.

A call in flight when its gateway process died ends as an error record (`error` starting with
`gateway_lost`, store/lost_calls.py) that holds no request and no tokens: it is never trainable
(records.prepare skips errors) and never enters the call forest, so the harness's retry — the
same request, served by another gateway process — simply continues the conversation (token-in
continuation and prefix_merging see no sibling to branch on). The trajectory says what happened:

- `metadata.lost_calls`: one entry per lost call, `{"call_id", "started_at", "provider",
  "error", "retried_by", "retry_count", "retry_trace_index"}`: `retried_by` is the first usable
  call of the same provider API admitted after it (what a client that retries does next),
  `retry_count` that call's own retry counter as its SDK sent it (x-stainless-retry-count; 0 when
  the client does not number retries), `retry_trace_index` the trace holding it (None when the
  session ended first, or the call is not in a trace);
- that trace's `metadata.retry_of_lost`: the lost call ids it retried;
- `stats.lost_calls`: how many.

A call id that also has an ok (or aborted) record was not lost (its gateway was only silent for
a while): records.prepare keeps that record and it is not listed here.

Tests: tests/merge/test_lost_calls.py; a real Claude Code retry: tests/harnesses/test_gateway_loss.py.
"""

from __future__ import annotations

from typing import Any, Sequence

from polar_mq.merge.records import is_aborted
from polar_mq.model import GATEWAY_LOST, CaptureRecord, Trace


def is_lost(rec: CaptureRecord) -> bool:
    return rec.status == "error" and (rec.error or "").startswith(GATEWAY_LOST)


def link_lost_calls(records: Sequence[CaptureRecord], traces: Sequence[Trace]) -> list[dict[str, Any]]:
    """The lost calls of a session with their retries (see the module doc); marks the traces."""
    usable = {r.call_id for r in records if r.status == "ok" or is_aborted(r)}
    lost = sorted({r.call_id: r for r in records if is_lost(r) and r.call_id not in usable}.values(),
                  key=lambda r: (r.started_at, r.call_id))
    if not lost:
        return []
    later = sorted((r for r in records if r.call_id in usable), key=lambda r: (r.started_at, r.call_id))
    trace_of = {cid: i for i, t in enumerate(traces) for cid in t.call_ids}
    out = []
    for rec in lost:
        after = [r for r in later if r.started_at >= rec.started_at
                 and (rec.provider in ("unknown", "") or r.provider == rec.provider)]
        retry = after[0] if after else None
        index = trace_of.get(retry.call_id) if retry is not None else None
        if index is not None:
            marks = traces[index].metadata.setdefault("retry_of_lost", [])
            if rec.call_id not in marks:
                marks.append(rec.call_id)
        out.append({"call_id": rec.call_id, "started_at": rec.started_at, "provider": rec.provider,
                    "error": rec.error, "retried_by": retry.call_id if retry is not None else None,
                    "retry_count": retry.retry_count if retry is not None else None,
                    "retry_trace_index": index})
    return out
