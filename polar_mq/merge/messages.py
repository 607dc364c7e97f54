"""Message-level identity of a conversation, independent of how it was tokenised.

When the token prefix breaks (a template that re-renders history differently, a changed system
header line, re-tokenised text) the *messages* still show that the new call continues the old
conversation. Keys are deliberately loose (role, text, tool names and arguments) because the
gateway normalises provider formats and a harness may re-serialise content parts.
"""

from __future__ import annotations

import json
from typing import Any

from polar_mq.model import CaptureRecord

SYSTEM_ROLES = frozenset({"system", "developer"})


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
                parts.append(str(part.get("text") or part.get("content") or ""))
        return "".join(parts).strip()
    return str(content).strip()


def _args(args: Any) -> str:
    if isinstance(args, str):
        raw = args
        try:
            args = json.loads(raw) if raw.strip() else {}
        except ValueError:
            return raw.strip()
    return json.dumps(args, sort_keys=True, separators=(",", ":"))


def message_key(message: dict[str, Any]) -> tuple[Any, ...]:
    calls = []
    for tc in message.get("tool_calls") or []:
        fn = tc.get("function") if isinstance(tc.get("function"), dict) else tc
        calls.append((fn.get("name"), _args(fn.get("arguments"))))
    return (message.get("role"), _text(message.get("content")), tuple(calls))


def dialogue_keys(rec: CaptureRecord, with_response: bool) -> list[tuple[Any, ...]]:
    """Keys of the non-system messages (system prompts carry per-turn header lines that some
    harnesses change), optionally followed by the assistant's answer."""
    keys = [message_key(m) for m in rec.messages or [] if m.get("role") not in SYSTEM_ROLES]
    if with_response and rec.response_message:
        keys.append(message_key(rec.response_message))
    return keys


def system_text(rec: CaptureRecord) -> str:
    return "\n".join(_text(m.get("content")) for m in rec.messages or []
                     if m.get("role") in SYSTEM_ROLES)
