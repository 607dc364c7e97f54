"""Anthropic Messages API <-> OpenAI chat.

Serves `POST /v1/messages` (also `?beta=true`) and `/v1/messages/count_tokens` for Claude Code,
the anthropic SDKs, opencode and pi. Pure logic: request bodies in, response bodies and SSE frames
out. See base.py for the adapter protocol.

Choices that matter for training data:
- Claude Code puts a per-turn `x-anthropic-billing-header: ...` line in the first system block;
  it changes every request and would break prefix merging, so it is removed (and noted).
- Thinking blocks carry a signature we issue ourselves (the reasoning token of reasoning.py). When
  the client sends the block back, the signed original reasoning is used, so the history sent upstream
  holds exactly what the model produced even if a client trims or rewrites the visible text.

Tests: tests/adapters/test_anthropic.py, tests/adapters/test_adapter_kit.py, tests/gateway/test_round_trips.py.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any, Iterator

from polar_mq.proxy_app.adapters.base import (ChatRequest, ChatResult, GatewayError, StreamEvent, StreamTranslator,
                                              dump_arguments, invalid, optional, parse_arguments, replayed, require,
                                              sse)
# The protocol defaults this adapter keeps (base.Adapter), re-exported as its own hooks.
from polar_mq.proxy_app.adapters.base import (error_in_stream as error_in_stream,
                                              stream_content_type as stream_content_type, stream_ping as stream_ping)
from polar_mq.proxy_app.shared_values import SHARED
from polar_mq.proxy_app.adapters.reasoning import decode_reasoning, encode_reasoning

PROVIDER = "anthropic"

BILLING_PREFIX = "x-anthropic-billing-header:"
ROLES = ("user", "assistant", "system")

# Error kind -> (HTTP status, Anthropic error type). `None` status keeps the error's own status.
_ERROR_TYPES: dict[str, tuple[int | None, str]] = {
    "invalid_request": (400, "invalid_request_error"),
    "authentication": (401, "authentication_error"),
    "permission": (403, "permission_error"),
    "not_found": (404, "not_found_error"),
    "too_large": (413, "request_too_large"),
    "context_length": (400, "invalid_request_error"),
    "rate_limit": (429, "rate_limit_error"),
    "upstream_error": (None, "api_error"),
    "upstream_unavailable": (529, "overloaded_error"),
    "store_unavailable": (529, "overloaded_error"),
    "upstream_timeout": (504, "timeout_error"),
    "internal": (500, "api_error"),
}

# Block types that only make sense with Anthropic's own server tools; dropped from history.
_SERVER_BLOCKS = {
    "server_tool_use", "web_search_tool_result", "web_fetch_tool_result", "code_execution_tool_result",
    "bash_code_execution_tool_result", "text_editor_code_execution_tool_result",
    "tool_search_tool_result", "mcp_tool_use", "mcp_tool_result", "container_upload",
}


# --------------------------------------------------------------------------------------------
# Request: Anthropic Messages -> OpenAI chat
# --------------------------------------------------------------------------------------------

def to_chat(body: dict[str, Any]) -> ChatRequest:
    """Normalise a Messages request. Raises GatewayError("invalid_request") naming the bad field.
    (count_tokens bodies have no max_tokens: `count_request_body` supplies one.)"""
    if not isinstance(body, dict):
        raise invalid("request body must be a JSON object")
    model = require(body, "model", str)
    raw_messages = require(body, "messages", list)
    notes: list[str] = []
    messages = _system_messages(body.get("system"), notes)
    if not raw_messages:
        raise invalid("field 'messages' must contain at least one message")
    for i, msg in enumerate(raw_messages):
        messages.extend(_message(msg, f"messages[{i}].", notes))
    tools, tool_notes = SHARED.derive(optional(body, "tools", list), "anthropic.tools", _chat_tools)
    notes.extend(tool_notes)
    params = _params(body, tools, notes)
    stream = optional(body, "stream", bool) or False
    thinking = _thinking_flag(body)
    for key in ("context_management", "mcp_servers", "container"):
        if body.get(key) is not None:
            notes.append(f"ignored {key}")
    extra = {"stop_sequences": params.get("stop") or [], "thinking": thinking}
    return ChatRequest(model=model, messages=messages, tools=tools, params=params, stream=stream,
                       notes=notes, extra=extra)


def _system_messages(system: Any, notes: list[str]) -> list[dict[str, Any]]:
    """Top-level `system` (string or text blocks) -> one system message, billing line removed."""
    if system is None:
        return []
    if isinstance(system, str):
        texts = [system]
    elif isinstance(system, list):
        texts = []
        for i, block in enumerate(system):
            texts.append(_text_block(block, f"system[{i}]."))
    else:
        raise invalid(f"field 'system' must be a string or an array, got {type(system).__name__}")
    if texts:
        first = _strip_billing(texts[0])
        if first != texts[0]:
            notes.append("stripped x-anthropic-billing-header line from system")
            texts[0] = first
        if not first.strip():
            texts = texts[1:]
    text = "\n\n".join(texts)
    return [{"role": "system", "content": text}] if texts else []


def _strip_billing(text: str) -> str:
    """Drop Claude Code's per-request billing line; it changes every turn."""
    lines = text.split("\n")
    kept = [line for line in lines if not line.lstrip().lower().startswith(BILLING_PREFIX)]
    if len(kept) == len(lines):
        return text
    return "\n".join(kept).lstrip("\n")


def _text_block(block: Any, where: str) -> str:
    if not isinstance(block, dict):
        raise invalid(f"field '{where.rstrip('.')}' must be an object")
    kind = block.get("type", "text")
    if kind != "text":
        raise invalid(f"field '{where}type' must be 'text', got {kind!r}")
    return require(block, "text", str, where)


def _message(msg: Any, where: str, notes: list[str]) -> list[dict[str, Any]]:
    """One Anthropic message -> one or more OpenAI chat messages (tool results split out)."""
    if not isinstance(msg, dict):
        raise invalid(f"field '{where.rstrip('.')}' must be an object")
    role = require(msg, "role", str, where)
    if role not in ROLES:
        raise invalid(f"field '{where}role' must be 'user', 'assistant' or 'system', got {role!r}")
    content = msg.get("content")
    if content is None:
        raise invalid(f"missing required field '{where}content'")
    if not isinstance(content, (str, list)):
        raise invalid(f"field '{where}content' must be a string or an array, got {type(content).__name__}")
    if role == "assistant":
        return [_assistant(content, where, notes)]
    if role == "system":
        text = content if isinstance(content, str) else "\n\n".join(
            _text_block(b, f"{where}content[{j}].") for j, b in enumerate(content))
        return [{"role": "system", "content": text}]
    return _user(content, where, notes)


def _user(content: str | list[Any], where: str, notes: list[str]) -> list[dict[str, Any]]:
    """User content -> tool messages first (OpenAI needs them right after the assistant turn),
    then one user message with the remaining parts (plus any images that came in tool results)."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    tool_msgs: list[dict[str, Any]] = []
    moved: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        bw = f"{where}content[{j}]."
        kind = _block_type(block, bw)
        if kind == "tool_result":
            msg, images = _tool_result(block, bw, notes)
            tool_msgs.append(msg)
            moved.extend(images)
        else:
            parts.extend(_user_part(block, kind, bw, notes))
    if moved:
        notes.append(f"moved {len(moved)} tool-result image(s) into a user message")
    out = list(tool_msgs)
    all_parts = moved + parts
    if all_parts or not tool_msgs:
        out.append({"role": "user", "content": _collapse(all_parts)})
    return out


def _collapse(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """Text-only content becomes one string (what vLLM would make of it anyway); with images the
    OpenAI part list is kept."""
    if all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts


def _block_type(block: Any, where: str) -> str:
    if not isinstance(block, dict):
        raise invalid(f"field '{where.rstrip('.')}' must be an object")
    return require(block, "type", str, where)


def _user_part(block: dict[str, Any], kind: str, where: str, notes: list[str]) -> list[dict[str, Any]]:
    if kind == "text":
        return [{"type": "text", "text": require(block, "text", str, where)}]
    if kind == "image":
        return [_image(block, where)] if _image_ok(block, where, notes) else []
    if kind == "document":
        return _document(block, where, notes)
    if kind == "search_result":
        texts = [b.get("text", "") for b in block.get("content") or [] if isinstance(b, dict)]
        return [{"type": "text", "text": "\n".join(t for t in texts if t)}]
    if kind in ("thinking", "redacted_thinking"):
        notes.append(f"dropped {kind} block in user message")
        return []
    notes.append(f"dropped unsupported block type {kind}")
    return []


def _image_ok(block: dict[str, Any], where: str, notes: list[str]) -> bool:
    source = require(block, "source", dict, where)
    kind = require(source, "type", str, f"{where}source.")
    if kind in ("base64", "url"):
        return True
    notes.append(f"dropped image with source type {kind}")
    return False


def _image(block: dict[str, Any], where: str) -> dict[str, Any]:
    """Image block -> OpenAI `image_url` part (data URL for base64 sources)."""
    source = block["source"]
    sw = f"{where}source."
    if source["type"] == "url":
        url = require(source, "url", str, sw)
    else:
        media = require(source, "media_type", str, sw)
        url = f"data:{media};base64,{require(source, 'data', str, sw)}"
    return {"type": "image_url", "image_url": {"url": url}}


def _document(block: dict[str, Any], where: str, notes: list[str]) -> list[dict[str, Any]]:
    """Plain-text and content documents become text; PDFs and files cannot reach a chat model."""
    source = require(block, "source", dict, where)
    kind = require(source, "type", str, f"{where}source.")
    if kind == "text":
        return [{"type": "text", "text": require(source, "data", str, f"{where}source.")}]
    if kind == "content":
        inner = source.get("content")
        if isinstance(inner, str):
            return [{"type": "text", "text": inner}]
        parts: list[dict[str, Any]] = []
        for j, sub in enumerate(inner or []):
            sw = f"{where}source.content[{j}]."
            parts.extend(_user_part(sub, _block_type(sub, sw), sw, notes))
        return parts
    notes.append(f"dropped document with source type {kind}")
    return []


def _tool_result(block: dict[str, Any], where: str,
                 notes: list[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """tool_result -> (role tool message, images to move into a following user message)."""
    call_id = require(block, "tool_use_id", str, where)
    content = block.get("content")
    images: list[dict[str, Any]] = []
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        texts = []
        for j, sub in enumerate(content):
            sw = f"{where}content[{j}]."
            kind = _block_type(sub, sw)
            if kind == "image":
                if _image_ok(sub, sw, notes):
                    images.append(_image(sub, sw))
                continue
            for part in _user_part(sub, kind, sw, notes):
                if part["type"] == "text":
                    texts.append(part["text"])
                else:
                    images.append(part)
        text = "\n".join(texts)
    else:
        raise invalid(f"field '{where}content' must be a string or an array, got {type(content).__name__}")
    if optional(block, "is_error", bool, where):
        text = f"Error: {text}"
        notes.append(f"tool result {call_id} marked is_error")
    return {"role": "tool", "tool_call_id": call_id, "content": text}, images


def _assistant(content: str | list[Any], where: str, notes: list[str]) -> dict[str, Any]:
    """Assistant content -> one assistant message with content, tool_calls and reasoning."""
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        bw = f"{where}content[{j}]."
        kind = _block_type(block, bw)
        if kind == "text":
            texts.append(require(block, "text", str, bw))
        elif kind == "tool_use":
            calls.append(_tool_use(block, bw))
        elif kind == "thinking":
            reasoning.append(_thinking_text(block, bw, notes))
        elif kind == "redacted_thinking":
            notes.append("dropped redacted_thinking block")
        elif kind in _SERVER_BLOCKS:
            notes.append(f"dropped server block {kind}")
        else:
            notes.append(f"dropped unsupported block type {kind}")
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if calls:
        msg["tool_calls"] = calls
    if reasoning:
        msg["reasoning"] = "\n\n".join(reasoning)
    return msg


def _tool_use(block: dict[str, Any], where: str) -> dict[str, Any]:
    call_id = require(block, "id", str, where)
    name = require(block, "name", str, where)
    args = block.get("input")
    if args is not None and not isinstance(args, dict):
        raise invalid(f"field '{where}input' must be an object, got {type(args).__name__}")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": dump_arguments(args or {})}}


def _thinking_text(block: dict[str, Any], where: str, notes: list[str]) -> str:
    """The reasoning to send upstream: the signed original when we issued the signature."""
    shown = require(block, "thinking", str, where)
    signed = decode_reasoning(block.get("signature"))
    if signed is None:
        notes.append("thinking block with a signature not issued by this gateway")
        return shown
    if signed != shown:
        notes.append("thinking text differs from its signature; used the signed original")
    return signed


def _chat_tools(raw: list[Any] | None) -> tuple[list[dict[str, Any]], list[str]]:
    """(the OpenAI tools, the notes on what was dropped): once per shared tool list
    (shared_values.py), as harnesses send the same tools on every call."""
    notes: list[str] = []
    return _tools(raw, notes), notes


def _tools(raw: list[Any] | None, notes: list[str]) -> list[dict[str, Any]]:
    """Custom tools -> OpenAI function tools; Anthropic server tools cannot run here: dropped."""
    tools: list[dict[str, Any]] = []
    for i, tool in enumerate(raw or []):
        where = f"tools[{i}]."
        if not isinstance(tool, dict):
            raise invalid(f"field 'tools[{i}]' must be an object")
        kind = tool.get("type")
        if kind not in (None, "custom"):
            notes.append(f"dropped server tool {tool.get('name') or kind} ({kind})")
            continue
        name = require(tool, "name", str, where)
        schema = require(tool, "input_schema", dict, where)
        fn: dict[str, Any] = {"name": name}
        description = optional(tool, "description", str, where)
        if description is not None:
            fn["description"] = description
        fn["parameters"] = schema  # key order name, description, parameters: it shows in templates
        if isinstance(tool.get("strict"), bool):
            fn["strict"] = tool["strict"]
        tools.append({"type": "function", "function": fn})
    return tools


def _params(body: dict[str, Any], tools: list[dict[str, Any]], notes: list[str]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    max_tokens = require(body, "max_tokens", int)
    if max_tokens < 1:
        raise invalid("field 'max_tokens' must be at least 1")
    params["max_tokens"] = max_tokens
    for name in ("temperature", "top_p"):
        value = optional(body, name, (int, float))
        if value is not None:
            params[name] = value
    top_k = optional(body, "top_k", int)
    if top_k is not None:
        params["top_k"] = top_k
    stop = optional(body, "stop_sequences", list)
    if stop:
        if not all(isinstance(s, str) for s in stop):
            raise invalid("field 'stop_sequences' must be an array of strings")
        params["stop"] = list(stop)
    _thinking_params(body, params, notes)
    _format_params(body, params, notes)
    _tool_choice_params(body, tools, params, notes)
    return params


def _thinking_flag(body: dict[str, Any]) -> bool | None:
    thinking = body.get("thinking")
    if not isinstance(thinking, dict):
        return None
    return thinking.get("type") != "disabled"


def _thinking_params(body: dict[str, Any], params: dict[str, Any], notes: list[str]) -> None:
    """`thinking` -> chat_template_kwargs.enable_thinking (the Qwen/vLLM switch)."""
    thinking = optional(body, "thinking", dict)
    if thinking is None:
        return
    kind = require(thinking, "type", str, "thinking.")
    if kind not in ("enabled", "adaptive", "disabled", "between_tools"):
        raise invalid(f"field 'thinking.type' must be 'enabled', 'adaptive' or 'disabled', got {kind!r}")
    enable = kind != "disabled"
    params["chat_template_kwargs"] = {"enable_thinking": enable}
    notes.append(f"thinking {kind} -> enable_thinking={str(enable).lower()}")


def _format_params(body: dict[str, Any], params: dict[str, Any], notes: list[str]) -> None:
    """`output_config.format` / beta `output_format` JSON schema -> response_format json_schema."""
    config = optional(body, "output_config", dict) or {}
    fmt = config.get("format") if config.get("format") is not None else body.get("output_format")
    where = "output_config.format." if config.get("format") is not None else "output_format."
    if config.get("effort") is not None:
        notes.append(f"ignored output_config.effort={config['effort']}")
    if fmt is None:
        return
    if not isinstance(fmt, dict):
        raise invalid(f"field '{where.rstrip('.')}' must be an object")
    kind = require(fmt, "type", str, where)
    if kind != "json_schema":
        raise invalid(f"field '{where}type' must be 'json_schema', got {kind!r}")
    schema = require(fmt, "schema", dict, where)
    params["response_format"] = {"type": "json_schema",
                                 "json_schema": {"name": "output", "schema": schema, "strict": True}}


def _tool_choice_params(body: dict[str, Any], tools: list[dict[str, Any]], params: dict[str, Any],
                        notes: list[str]) -> None:
    """tool_choice auto|any|tool|none -> OpenAI auto|required|named function|none."""
    choice = optional(body, "tool_choice", dict)
    if choice is None:
        return
    kind = require(choice, "type", str, "tool_choice.")
    if choice.get("disable_parallel_tool_use") is True and tools:
        params["parallel_tool_calls"] = False
    if kind == "none":
        params["tool_choice"] = "none"
        return
    if kind not in ("auto", "any", "tool"):
        raise invalid(f"field 'tool_choice.type' must be 'auto', 'any', 'tool' or 'none', got {kind!r}")
    if not tools:
        notes.append(f"dropped tool_choice {kind}: no client tools")
        return
    if kind == "auto":
        params["tool_choice"] = "auto"
    elif kind == "any":
        params["tool_choice"] = "required"
    else:
        name = require(choice, "name", str, "tool_choice.")
        if name not in {t["function"]["name"] for t in tools}:
            raise invalid(f"field 'tool_choice.name' names unknown tool {name!r}")
        params["tool_choice"] = {"type": "function", "function": {"name": name}}


# --------------------------------------------------------------------------------------------
# Response: OpenAI chat -> Anthropic Messages
# --------------------------------------------------------------------------------------------

def from_chat(result: ChatResult, req: ChatRequest) -> dict[str, Any]:
    """The whole answer as an Anthropic `message` body."""
    stop_reason, stop_sequence = _stop(result, req)
    return {
        "id": _message_id(result),
        "type": "message",
        "role": "assistant",
        "model": req.model,
        "content": _content_blocks(result),
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": _usage(result),
    }


_NOT_ALNUM = re.compile(r"[^A-Za-z0-9]")


def _message_id(result: ChatResult) -> str:
    """Anthropic ids start with msg_; derive from the upstream id so both can be correlated."""
    tail = _NOT_ALNUM.sub("", result.id or "") or uuid.uuid4().hex
    return f"msg_{tail}"


def _usage(result: ChatResult) -> dict[str, int]:
    prompt = result.prompt_tokens or len(result.prompt_token_ids or [])
    completion = result.completion_tokens or len(result.completion_token_ids or [])
    return {"input_tokens": prompt, "output_tokens": completion,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


def _content_blocks(result: ChatResult) -> list[dict[str, Any]]:
    """thinking -> text -> tool_use, in that order (the order Claude produces them)."""
    blocks: list[dict[str, Any]] = []
    if result.reasoning:
        blocks.append({"type": "thinking", "thinking": result.reasoning,
                       "signature": encode_reasoning(result.reasoning)})
    if result.text:
        blocks.append({"type": "text", "text": result.text})
    for call in result.tool_calls:
        fn = call.get("function") or {}
        blocks.append({"type": "tool_use", "id": _tool_id(call), "name": fn.get("name") or "",
                       "input": _tool_input(fn.get("arguments"))})
    if not blocks:
        blocks.append({"type": "text", "text": ""})
    return blocks


def _tool_id(call: dict[str, Any]) -> str:
    call_id = call.get("id")
    if isinstance(call_id, str) and call_id:
        return call_id
    call_id = f"toolu_{uuid.uuid4().hex[:24]}"
    call["id"] = call_id  # keep it for the stream and the record: same id everywhere
    return call_id


def _tool_input(arguments: Any) -> dict[str, Any]:
    """Anthropic tool input must be an object; anything else is kept under `_raw`."""
    parsed = parse_arguments(arguments)
    return parsed if isinstance(parsed, dict) else {"_raw": arguments}


def _tool_json(arguments: Any) -> str:
    """The arguments as JSON text for input_json_delta: upstream's own text when it is already a
    JSON object (unaltered), else the serialised input."""
    if isinstance(arguments, str):
        try:
            if isinstance(json.loads(arguments), dict):
                return arguments
        except ValueError:
            pass
    return json.dumps(_tool_input(arguments), ensure_ascii=False)


def _stop(result: ChatResult, req: ChatRequest) -> tuple[str, str | None]:
    """finish_reason (+ the matched stop string vLLM reports as `stop_reason`) -> Anthropic's."""
    if result.tool_calls or result.finish_reason == "tool_calls":
        return "tool_use", None
    if result.finish_reason == "length":
        return "max_tokens", None
    matched = _matched_stop(result)
    if matched is not None and matched in (req.extra.get("stop_sequences") or []):
        return "stop_sequence", matched
    if result.finish_reason == "content_filter":
        return "refusal", None
    return "end_turn", None


def _matched_stop(result: ChatResult) -> str | None:
    choices = result.raw.get("choices") if isinstance(result.raw, dict) else None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        value = choices[0].get("stop_reason")
        return value if isinstance(value, str) else None
    return None


class MessagesTranslator(StreamTranslator):
    """Normalised events -> the Messages stream: message_start, then content blocks in the order
    the model produces them (thinking, text, tool_use), each started before its deltas and stopped
    before the next begins, then message_delta and message_stop.

    Tool arguments are passed through piece by piece when they open like a JSON object (`{"` or
    `{}`); anything else is held to the end of the call and sent as one valid JSON object
    (`{"_raw": ...}`), because the SDKs parse partial_json as it arrives."""

    def __init__(self, req: ChatRequest):
        super().__init__(req)
        self.index = -1
        self.kind: str | None = None  # type of the open block
        self.reasoning: list[str] = []
        self.args: list[str] = []  # the open tool_use block's arguments so far
        self.args_mode: str | None = None  # None: undecided, "pass": streaming, "hold": buffering

    def on_start(self, event: StreamEvent) -> Iterator[bytes]:
        tail = re.sub(r"[^A-Za-z0-9]", "", event.id or "") or uuid.uuid4().hex
        start: dict[str, Any] = {"id": f"msg_{tail}", "type": "message", "role": "assistant", "model": self.req.model,
                 "content": [], "stop_reason": None, "stop_sequence": None,
                 "usage": {"input_tokens": event.prompt_tokens, "output_tokens": 0,
                           "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}
        yield sse({"type": "message_start", "message": start}, event="message_start")

    def _open(self, kind: str, block: dict[str, Any]) -> Iterator[bytes]:
        yield from self._close()
        self.index += 1
        self.kind = kind
        yield sse({"type": "content_block_start", "index": self.index, "content_block": block},
                  event="content_block_start")

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return sse({"type": "content_block_delta", "index": self.index, "delta": delta},
                   event="content_block_delta")

    def _close(self) -> Iterator[bytes]:
        if self.kind is None:
            return
        if self.kind == "thinking":
            yield self._delta({"type": "signature_delta", "signature": encode_reasoning("".join(self.reasoning))})
            self.reasoning = []
        elif self.kind == "tool_use":
            text = "".join(self.args)
            if self.args_mode != "pass":  # held, undecided or empty: one whole, valid object
                yield self._delta({"type": "input_json_delta", "partial_json": _tool_json(text)})
            self.args, self.args_mode = [], None
        yield sse({"type": "content_block_stop", "index": self.index}, event="content_block_stop")
        self.kind = None

    def on_reasoning(self, event: StreamEvent) -> Iterator[bytes]:
        if not event.text:
            return
        if self.kind != "thinking":
            yield from self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
        self.reasoning.append(event.text)
        yield self._delta({"type": "thinking_delta", "thinking": event.text})

    def on_text(self, event: StreamEvent) -> Iterator[bytes]:
        if not event.text:
            return
        if self.kind != "text":
            yield from self._open("text", {"type": "text", "text": ""})
        yield self._delta({"type": "text_delta", "text": event.text})

    def on_tool_start(self, event: StreamEvent) -> Iterator[bytes]:
        call_id = event.id or f"toolu_{uuid.uuid4().hex[:24]}"
        yield from self._open("tool_use", {"type": "tool_use", "id": call_id, "name": event.name or "",
                                           "input": {}})

    def on_tool_args(self, event: StreamEvent) -> Iterator[bytes]:
        if self.kind != "tool_use" or not event.text:
            return
        if self.args_mode == "pass":
            yield self._delta({"type": "input_json_delta", "partial_json": event.text})
            return
        self.args.append(event.text)
        if self.args_mode is None:
            head = "".join(self.args).lstrip()
            rest = head[1:].lstrip()
            if head and head[0] != "{":
                self.args_mode = "hold"
            elif rest:
                self.args_mode = "pass" if rest[0] in '"}' else "hold"
            if self.args_mode == "pass":
                yield self._delta({"type": "input_json_delta", "partial_json": "".join(self.args)})

    def on_finish(self, result: ChatResult) -> Iterator[bytes]:
        if self.index < 0:  # an empty answer still has one (empty) text block
            yield from self._open("text", {"type": "text", "text": ""})
        yield from self._close()
        stop_reason, stop_sequence = _stop(result, self.req)
        delta = {"stop_reason": stop_reason, "stop_sequence": stop_sequence}
        yield sse({"type": "message_delta", "delta": delta, "usage": _usage(result)}, event="message_delta")
        yield sse({"type": "message_stop"}, event="message_stop")

    def error(self, err: GatewayError) -> Iterator[bytes]:
        return stream_error(err, self.req)


stream_translator = MessagesTranslator
# The whole answer as the Messages stream (synthetic streams): the same translator, replayed.
stream_events = replayed(MessagesTranslator)


# --------------------------------------------------------------------------------------------
# Errors and count_tokens
# --------------------------------------------------------------------------------------------

def error_response(err: GatewayError) -> tuple[int, dict[str, Any]]:
    """Anthropic's error shape; 529 overloaded for an unavailable upstream (clients back off)."""
    status, kind = _ERROR_TYPES.get(err.kind, (None, "api_error"))
    if status is None:
        status = err.status if err.status >= 500 else 502
    return status, _error_body(err, kind)


def _error_body(err: GatewayError, kind: str) -> dict[str, Any]:
    message = _context_message(err) if err.kind == "context_length" else err.message
    return {"type": "error", "error": {"type": kind, "message": message}}


def _context_message(err: GatewayError) -> str:
    """Claude Code recognises overflow by "prompt is too long: N tokens > M maximum"."""
    tokens = err.detail.get("prompt_tokens")
    limit = err.detail.get("max_model_len")
    if not isinstance(tokens, int):
        found = re.search(r"(?:requested|resulted in|prompt contains|has) (\d+) (?:input )?tokens", err.message)
        tokens = int(found.group(1)) if found else None
    if not isinstance(limit, int):
        found = re.search(r"maximum (?:context length|model length|input length) is (\d+)", err.message)
        limit = int(found.group(1)) if found else None
    if tokens is not None and limit is not None:
        return f"prompt is too long: {tokens} tokens > {limit} maximum"
    return f"prompt is too long: {err.message}"


def stream_error(err: GatewayError, req: ChatRequest) -> Iterator[bytes]:
    _, body = error_response(err)
    yield sse(body, event="error")


def count_request_body(body: dict[str, Any]) -> dict[str, Any]:
    """A count_tokens body has no max_tokens, which `to_chat` requires: one is supplied."""
    return {"max_tokens": 1, **body}


def count_tokens_response(n: int) -> dict[str, Any]:
    return {"input_tokens": n}
