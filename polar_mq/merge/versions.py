"""Versions per token in traces: a call's `policy_versions` pairs are offsets into its completion;
in a trace they become offsets into `response_ids` (prompt-side tokens excluded), shifted by
what comes before the call's sampled tokens there (earlier calls' tokens and the spliced-in
tool results of prefix_merging). Adjacent pairs with the same version merge into one, so a trace
sampled by one policy has one pair. Guarded by tests/gateway/test_policy_versions.py.
"""

from __future__ import annotations

from typing import Any

from polar_mq.model import CaptureRecord


def call_pairs(rec: CaptureRecord) -> list[list[Any]]:
    """The record's pairs, or one pair from its single `policy_version` (records written before
    the field existed)."""
    pairs = [list(p) for p in rec.policy_versions or [] if isinstance(p, (list, tuple)) and len(p) == 2]
    return pairs or [[0, rec.policy_version]]


def shifted(parts: list[tuple[int, CaptureRecord]]) -> list[list[Any]]:
    """(offset of the call's first sampled token in response_ids, record) in trace order ->
    the trace's pairs."""
    out: list[list[Any]] = []
    for base, rec in parts:
        for offset, version in call_pairs(rec):
            if out and out[-1][1] == version:
                continue
            out.append([base + int(offset), version])
    if out:
        out[0][0] = 0
    return out
