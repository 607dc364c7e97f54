"""Which recorded call of the session a request continues.

A request continues call P when its messages start with P's messages followed by P's assistant
reply, and then add at least one new message. Messages are compared after normalisation (content
parts joined, surrounding whitespace ignored, tool-call arguments compared as parsed JSON), since
harnesses re-serialise what they echo; the assistant reply is recognised by its tool-call ids
(ours, echoed back) or its name + arguments, and by its reasoning when the client sent it back
(the adapters restore it from our own thinking / encrypted-reasoning / thought signatures).

When several calls qualify the longest wins (the nearest ancestor); among equals the latest. When
none does, the reason says why, for the per-session drift statistics:

- ``first_call``: nothing recorded yet in this session;
- ``new_conversation``: nothing recorded starts like this request (a sub-agent, a side call, a
  compacted context that replaced the history);
- ``edited_history``: a recorded conversation has the same task (first non-system message) but the
  request changed something before its first recorded reply (a system prompt with a per-turn
  header line, a rewritten message). An edit *after* a recorded reply still continues that reply:
  its ids are exact, the edited rest is rendered as new messages;
- ``tools_changed``: the history matches but the tool list differs (the prompt's tool block would
  change);
- ``no_token_ids`` / ``parent_failed``: the matching call cannot be continued (no ids, error).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from polar_mq.model import CaptureRecord

SYSTEM_ROLES = ("system", "developer")


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content.strip()
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict):
                if isinstance(part.get("text"), str):
                    parts.append(part["text"])
                else:
                    parts.append(json.dumps(part, sort_keys=True))
        return "\n".join(parts).strip()
    return json.dumps(content, sort_keys=True)


def _args(args: Any) -> str:
    if isinstance(args, str):
        raw = args
        try:
            args = json.loads(raw) if raw.strip() else {}
        except ValueError:
            return raw.strip()
    return json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _calls(message: dict[str, Any]) -> list[tuple[str | None, str | None, str]]:
    out = []
    for tc in message.get("tool_calls") or []:
        if not isinstance(tc, dict):
            continue
        fn: dict[str, Any] = tc["function"] if isinstance(tc.get("function"), dict) else tc
        out.append((tc.get("id"), fn.get("name"), _args(fn.get("arguments"))))
    return out


def message_key(message: dict[str, Any]) -> tuple[Any, ...]:
    """What must be equal for two messages of a history to be the same message."""
    role = message.get("role")
    key: tuple[Any, ...] = (role, _text(message.get("content")),
                  tuple((name, args) for _id, name, args in _calls(message)))
    if role == "tool":
        key += (message.get("tool_call_id"),)
    if role == "assistant":
        key += ((message.get("reasoning") or message.get("reasoning_content") or "").strip(),)
    return key


def reply_signature(reply: dict[str, Any]) -> tuple[Any, ...]:
    """What `same_reply` compares of a recorded reply (its tool calls, text and reasoning): kept
    instead of the reply by the session index (index.py)."""
    return (_calls(reply), _text(reply.get("content")), (reply.get("reasoning") or "").strip())


def matches_reply(echoed: dict[str, Any], signature: tuple[Any, ...]) -> bool:
    """Is `echoed` (the client's copy in its history) the reply of this `reply_signature`?"""
    if echoed.get("role") != "assistant":
        return False
    mine, text, reasoning = signature
    theirs = _calls(echoed)
    if len(mine) != len(theirs):
        return False
    for (id_a, name_a, args_a), (id_b, name_b, args_b) in zip(mine, theirs):
        if id_a and id_b and id_a == id_b and name_a == name_b:
            continue  # our own id, echoed: the same call even if the arguments were re-serialised
        if (name_a, args_a) != (name_b, args_b):
            return False
    if _text(echoed.get("content")) != text:
        return False
    echoed_reasoning = (echoed.get("reasoning") or echoed.get("reasoning_content") or "").strip()
    return not echoed_reasoning or echoed_reasoning == reasoning


def same_reply(echoed: dict[str, Any], reply: dict[str, Any]) -> bool:
    """Is `echoed` (the client's copy in its history) the recorded assistant `reply`?"""
    return matches_reply(echoed, reply_signature(reply))


def tools_key(tools: list[dict[str, Any]] | None) -> str:
    return json.dumps(tools or [], sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass
class Match:
    parent: CaptureRecord | None
    reason: str  # "continued" or why not
    retry_of: str | None = None  # an earlier call with the very same request (a harness retry)
    lineage: str | None = None  # the call id the conversation extends, continued or not


def _usable(rec: CaptureRecord) -> str | None:
    return unusable(rec.status, rec.response_message is not None, bool(rec.prompt_token_ids),
                    bool(rec.completion_token_ids))


def unusable(status: str, has_reply: bool, has_prompt_ids: bool, has_completion_ids: bool) -> str | None:
    """Why a recorded call cannot be continued by token ids (None: it can)."""
    if status != "ok" or not has_reply:
        return "parent_failed"
    if not has_prompt_ids or not has_completion_ids:
        return "no_token_ids"
    return None


def find_parent(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                records: list[CaptureRecord]) -> Match:
    """The recorded call this conversation continues, or why there is none."""
    keys = [message_key(m) for m in messages]
    want_tools = tools_key(tools)
    gens = [r for r in records if r.kind == "generation"]
    best: CaptureRecord | None = None
    blocked: str | None = None
    blocked_rec: CaptureRecord | None = None
    shares_start = False
    retry_of = None
    first_dialogue = next((i for i, m in enumerate(messages) if m.get("role") not in SYSTEM_ROLES),
                          len(messages))
    def same(i: int, other: dict[str, Any]) -> bool:
        # identical dicts (the usual case: the same adapter normalised the same history) first
        return messages[i] == other or keys[i] == message_key(other)

    for rec in gens:
        n = len(rec.messages or [])
        if n == 0:
            continue
        common = 0
        for i in range(min(n, len(messages))):
            if not same(i, rec.messages[i]):
                break
            common += 1
        if common == n == len(messages) and retry_of is None and tools_key(rec.tools) == want_tools:
            retry_of = rec.call_id
        if not shares_start and first_dialogue < len(keys) and (
                common > first_dialogue
                or any(same(first_dialogue, m) for m in rec.messages[:first_dialogue + 2])):
            shares_start = True  # the same task, said again after an edited system prompt or so
        if common < n or len(messages) < n + 2:
            continue
        if rec.response_message is None or not same_reply(messages[n], rec.response_message):
            continue
        if tools_key(rec.tools) != want_tools:
            blocked, blocked_rec = blocked or "tools_changed", blocked_rec or rec
            continue
        problem = _usable(rec)
        if problem:
            blocked, blocked_rec = blocked or problem, blocked_rec or rec
            continue
        if best is None or (n, rec.started_at) >= (len(best.messages), best.started_at):
            best = rec
    if best is not None:
        return Match(best, "continued", retry_of, best.call_id)
    if blocked:
        return Match(None, blocked, retry_of, blocked_rec.call_id if blocked_rec else None)
    if not gens:
        return Match(None, "first_call", retry_of)
    return Match(None, "edited_history" if shares_start else "new_conversation", retry_of)
