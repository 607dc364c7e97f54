"""Normalising a session's records into usable calls, in one canonical order.

Builders must not depend on the order records arrive in (Redis scans, retries and parallel
writers all reorder them), so every builder starts here: records are deduplicated by call id,
sorted by (started_at, call_id), and the unusable ones are counted rather than silently lost.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Iterable, Mapping

from polar_mq.model import CaptureRecord

STOP_REASONS = frozenset({"stop", "tool_calls", "function_call", "end_turn", "stop_sequence"})
TRUNCATED_REASONS = frozenset({"length", "max_tokens"})
ABORTED_REASON = "abort"  # the gateway stopped the generation (capture.fill_partial marks it)


def is_aborted(rec: CaptureRecord) -> bool:
    """A generation the gateway stopped mid-way (budget timeout, cancel, client gone) that kept
    what it sampled: it belongs in the trajectory. Upstream errors do not (their status is error
    too, but their finish_reason is never "abort")."""
    return rec.status == "error" and rec.finish_reason == ABORTED_REASON


def as_record(item: CaptureRecord | Mapping[str, Any], session_id: str | None = None) -> CaptureRecord:
    """Accept a CaptureRecord or its dict form (as served by the gateway or read from msgpack)."""
    if isinstance(item, CaptureRecord):
        return item
    if not isinstance(item, Mapping):
        raise TypeError(f"expected CaptureRecord or dict, got {type(item).__name__}")
    data = dict(item)
    data.setdefault("session_id", session_id or "")
    data.setdefault("provider", "openai_chat")
    for key in ("prompt_token_ids", "completion_token_ids", "completion_logprobs",
                "messages", "tools"):
        if data.get(key) is None:
            data[key] = []
    return CaptureRecord.from_dict(data)


@dataclass
class Call:
    """One usable model call. ``index`` is its position in canonical order; ``logprobs`` is None
    when the recorded logprobs do not line up one-to-one with the sampled ids."""

    index: int
    record: CaptureRecord
    prompt: list[int]
    completion: list[int]
    logprobs: list[float] | None

    @cached_property
    def full(self) -> list[int]:
        """The whole sequence the model saw and produced: prompt + sampled tokens."""
        return self.prompt + self.completion

    @property
    def call_id(self) -> str:
        return self.record.call_id

    @property
    def started_at(self) -> float:
        return self.record.started_at

    @property
    def aborted(self) -> bool:
        return is_aborted(self.record)

    @property
    def truncated(self) -> bool:
        return (self.record.finish_reason or "") in TRUNCATED_REASONS


@dataclass
class Prepared:
    """Usable calls in canonical order, plus what was set aside and why."""

    calls: list[Call]
    records: int
    skipped: Counter[str] = field(default_factory=Counter)
    sampled_tokens: int = 0  # sampled in ok and aborted calls (the delivery denominator)


def _canonical_key(rec: CaptureRecord) -> tuple[Any, ...]:
    return (float(rec.started_at or 0.0), str(rec.call_id))


def _preference(rec: CaptureRecord) -> tuple[Any, ...]:
    """Among records sharing a call id keep the most complete one, independent of arrival."""
    return (rec.status == "ok", is_aborted(rec), len(rec.completion_token_ids or []),
            len(rec.prompt_token_ids or []), -float(rec.started_at or 0.0))


def prepare(items: Iterable[CaptureRecord | Mapping[str, Any]],
            session_id: str | None = None) -> Prepared:
    records = [as_record(item, session_id) for item in items]
    best: dict[str, CaptureRecord] = {}
    skipped: Counter[str] = Counter()
    for rec in records:
        other = best.get(rec.call_id)
        if other is None:
            best[rec.call_id] = rec
            continue
        skipped["duplicate"] += 1
        if _preference(rec) > _preference(other):
            best[rec.call_id] = rec
    calls: list[Call] = []
    sampled = 0
    for rec in sorted(best.values(), key=_canonical_key):
        if rec.kind != "generation":
            skipped[rec.kind or "other"] += 1
            continue
        if rec.status != "ok" and not is_aborted(rec):
            skipped["error"] += 1
            continue
        completion = list(rec.completion_token_ids or [])
        sampled += len(completion)
        prompt = list(rec.prompt_token_ids or [])
        if not prompt or not completion:
            skipped["no_token_ids"] += 1
            continue
        lps = rec.completion_logprobs
        logprobs = [float(x) for x in lps] if lps and len(lps) == len(completion) else None
        calls.append(Call(len(calls), rec, prompt, completion, logprobs))
    return Prepared(calls=calls, records=len(records), skipped=skipped, sampled_tokens=sampled)


def conversation_messages(rec: CaptureRecord) -> list[dict[str, Any]]:
    """The messages sent plus the assistant's answer: the conversation as the call left it."""
    msgs = list(rec.messages or [])
    if rec.response_message:
        msgs.append(rec.response_message)
    return msgs
