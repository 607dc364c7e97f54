"""The end-of-turn token: configured, or inferred from the session itself.

The upstream reports the end-of-turn token among the sampled ids when it stopped on it, so the
most common last token of calls that finished normally is the template's end-of-turn token. A
token that ends fewer than half of them is not trusted (the upstream may strip it).
"""

from __future__ import annotations

from collections import Counter

from polar_mq.merge.records import STOP_REASONS, Call


def infer_eos(calls: list[Call], min_support: float = 0.5) -> int | None:
    lasts = Counter(c.completion[-1] for c in calls
                    if (c.record.finish_reason or "") in STOP_REASONS and c.completion)
    if not lasts:
        return None
    total = sum(lasts.values())
    token, count = min(lasts.items(), key=lambda kv: (-kv[1], kv[0]))
    return token if count >= min_support * total else None


def resolve_eos(calls: list[Call], configured: int | None, infer: bool) -> tuple[int | None, str]:
    """(token id, where it came from: config | inferred | none)."""
    if configured is not None:
        return configured, "config"
    if infer:
        token = infer_eos(calls)
        if token is not None:
            return token, "inferred"
    return None, "none"
