"""Sampled text → the assistant message, as the upstream's own parsers would give it.

The token-in path generates through `/v1/completions`, which returns raw ids, so the gateway parses
them itself, the way vLLM's chat path does with `--tool-call-parser hermes` and a `<think>`
reasoning parser: reasoning between `<think>` and `</think>` at the start; content is the text
before the first `<tool_call>` (None when empty); each `<tool_call>{"name", "arguments"}</tool_call>`
becomes a tool call whose arguments are `json.dumps(arguments, ensure_ascii=False)`; a tool-call
JSON that does not parse leaves the whole text as content (vLLM does the same). Without tools in
the request nothing is parsed as a tool call and special tokens are dropped from the text.

`StreamParser` gives the same message piece by piece: it emits only what can no longer change
(a partial tag at the end is held back), so the pieces concatenate to exactly `parse_text`'s
result.

Tests: tests/tito/test_tito_parse.py.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

THINK_START, THINK_END = "<think>", "</think>"
TOOL_START, TOOL_END = "<tool_call>", "</tool_call>"
_TOOL_RE = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.S)


def new_tool_call_id() -> str:
    """vLLM's id shape for parsed tool calls (`chatcmpl-tool-<hex>`)."""
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


@dataclass
class Parsed:
    reasoning: str = ""
    content: str = ""
    calls: list[dict[str, str]] = field(default_factory=list)  # [{"name", "arguments"}]


def _overlap(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def _split_reasoning(text: str, final: bool) -> tuple[str, str, bool]:
    """(reasoning, rest, reasoning finished). Only a `<think>` at the very start opens reasoning."""
    if not text.startswith(THINK_START):
        if not final and THINK_START.startswith(text):
            return "", "", False  # could still become "<think>"
        return "", text, True
    body = text[len(THINK_START):]
    end = body.find(THINK_END)
    if end < 0:
        if final:
            return body.strip("\n"), "", True
        keep = body[:len(body) - _overlap(body, THINK_END)]
        return keep.lstrip("\n").rstrip("\n"), "", False
    return body[:end].strip("\n"), body[end + len(THINK_END):].lstrip("\n"), True


def _tool_calls(text: str) -> list[dict[str, str]] | None:
    """The hermes calls in `text`; None when one of them is not valid JSON with a name."""
    calls = []
    for closed, open_ended in _TOOL_RE.findall(text):
        try:
            obj = json.loads(closed or open_ended)
            if not isinstance(obj["name"], str):  # vLLM's FunctionCall(name: str) refuses it: text
                return None
            calls.append({"name": obj["name"],
                          "arguments": json.dumps(obj.get("arguments", {}), ensure_ascii=False)})
        except (ValueError, KeyError, TypeError):
            return None
    return calls


def parse_text(text: str, tools: bool, special: list[str], final: bool = True) -> Parsed:
    """The message in `text` (sampled ids decoded without the end-of-turn token). With `final`
    False, only the part that cannot change any more (for streaming)."""
    reasoning, rest, thought = _split_reasoning(text, final)
    if not thought:
        return Parsed(reasoning=reasoning)
    if not tools:
        for s in special:
            rest = rest.replace(s, "")
        if not final:
            rest = rest[:len(rest) - max((_overlap(rest, s) for s in special), default=0)]
        return Parsed(reasoning, rest)
    start = rest.find(TOOL_START)
    if start < 0:
        return Parsed(reasoning, rest if final else rest[:len(rest) - _overlap(rest, TOOL_START)])
    content, calls_text = rest[:start], rest[start:]
    if not final:
        # only whole calls: the text up to the last </tool_call>
        end = calls_text.rfind(TOOL_END)
        calls = _tool_calls(calls_text[:end + len(TOOL_END)]) if end >= 0 else []
        return Parsed(reasoning, content, calls or [])
    calls = _tool_calls(calls_text)
    if calls is None:  # unparseable: vLLM returns the whole output as content
        return Parsed(reasoning, rest)
    return Parsed(reasoning, content, calls)


def to_message(parsed: Parsed, call_ids: list[str]) -> dict[str, Any]:
    """The normalised assistant message (the shape upstream.normalise_message gives)."""
    while len(call_ids) < len(parsed.calls):
        call_ids.append(new_tool_call_id())
    msg: dict[str, Any] = {"role": "assistant", "content": parsed.content or None}
    if parsed.calls:
        msg["tool_calls"] = [{"id": call_ids[i], "type": "function",
                              "function": {"name": c["name"], "arguments": c["arguments"]}}
                             for i, c in enumerate(parsed.calls)]
    if parsed.reasoning:
        msg["reasoning"] = parsed.reasoning
    if msg["content"] is None and not parsed.calls and not parsed.reasoning:
        msg["content"] = ""
    return msg


class StreamParser:
    """Feeds on the growing text; each `step` returns the chat-completion delta of what became
    certain since the last step (reasoning, content, whole tool calls)."""

    def __init__(self, tools: bool, special: list[str]):
        self.tools = tools
        self.special = special
        self.sent = Parsed()
        self.call_ids: list[str] = []

    def step(self, text: str, final: bool = False) -> list[dict[str, Any]]:
        now = parse_text(text, self.tools, self.special, final)
        deltas: list[dict[str, Any]] = []
        if len(now.reasoning) > len(self.sent.reasoning) and now.reasoning.startswith(self.sent.reasoning):
            deltas.append({"reasoning": now.reasoning[len(self.sent.reasoning):]})
            self.sent.reasoning = now.reasoning
        if len(now.content) > len(self.sent.content) and now.content.startswith(self.sent.content):
            deltas.append({"content": now.content[len(self.sent.content):]})
            self.sent.content = now.content
        for i in range(len(self.sent.calls), len(now.calls)):
            call = now.calls[i]
            while len(self.call_ids) <= i:
                self.call_ids.append(new_tool_call_id())
            deltas.append({"tool_calls": [{"index": i, "id": self.call_ids[i], "type": "function",
                                           "function": {"name": call["name"], "arguments": ""}}]})
            deltas.append({"tool_calls": [{"index": i, "function": {"arguments": call["arguments"]}}]})
            self.sent.calls.append(call)
        return deltas
