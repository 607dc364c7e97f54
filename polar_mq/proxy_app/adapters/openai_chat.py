"""OpenAI Chat Completions ⇄ normalised chat (the upstream's own dialect, so mostly validation).

Clients: Qwen Code, opencode / pi with an openai-compatible provider, the openai SDK.

Tests: tests/adapters/test_adapter_kit.py, tests/gateway/test_round_trips.py.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Iterator

from polar_mq.proxy_app.adapters.base import (ChatRequest, ChatResult, GatewayError, StreamEvent, StreamTranslator,
                                              invalid, optional, replayed, require, sse)
# The protocol defaults this adapter keeps (base.Adapter), re-exported as its own hooks.
from polar_mq.proxy_app.adapters.base import (count_request_body as count_request_body,
                                              error_in_stream as error_in_stream,
                                              stream_content_type as stream_content_type, stream_ping as stream_ping)
from polar_mq.proxy_app.shared_values import SHARED
from polar_mq.proxy_app.adapters.openai_errors import error_object
from polar_mq.proxy_app.adapters.openai_errors import error_response as error_response

PROVIDER = "openai_chat"

# Parameters passed upstream unchanged (vLLM accepts all of them).
_PASS_PARAMS: dict[str, type | tuple[type, ...]] = {
    "temperature": (int, float), "top_p": (int, float), "top_k": int, "min_p": (int, float),
    "seed": int, "presence_penalty": (int, float), "frequency_penalty": (int, float),
    "repetition_penalty": (int, float), "logit_bias": dict, "response_format": dict,
    "tool_choice": (str, dict), "parallel_tool_calls": bool, "top_logprobs": int,
    "chat_template_kwargs": dict, "min_tokens": int, "ignore_eos": bool,
}
_ROLES = {"system", "developer", "user", "assistant", "tool", "function"}


def _text_of_parts(parts: list[Any]) -> str | None:
    """Text-only part arrays collapse to a string (as vLLM does); None if any part is not text."""
    texts = []
    for part in parts:
        if isinstance(part, dict) and part.get("type") in ("text", "input_text") and isinstance(part.get("text"), str):
            texts.append(part["text"])
        else:
            return None
    return "\n".join(texts)


def _message(msg: Any, i: int) -> dict[str, Any]:
    where = f"messages[{i}]."
    if not isinstance(msg, dict):
        raise invalid(f"messages[{i}] must be an object")
    role = require(msg, "role", str, where)
    if role not in _ROLES:
        raise invalid(f"messages[{i}].role must be one of {sorted(_ROLES)}, got {role!r}")
    out = dict(msg)
    if role == "developer":
        out["role"] = "system"
    if role == "function":  # legacy function-result messages
        out = {"role": "tool", "tool_call_id": msg.get("name", ""), "content": msg.get("content")}
    content = out.get("content")
    if content is not None and not isinstance(content, (str, list)):
        raise invalid(f"messages[{i}].content must be a string or an array of parts")
    if isinstance(content, list):
        text = _text_of_parts(content)
        if text is not None:
            out["content"] = text
    if role == "assistant":
        calls = optional(msg, "tool_calls", list, where)
        for j, call in enumerate(calls or []):
            if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
                raise invalid(f"messages[{i}].tool_calls[{j}] must be an object with 'function'")
            require(call["function"], "name", str, f"{where}tool_calls[{j}].function.")
        if "reasoning_content" in out and "reasoning" not in out:
            out["reasoning"] = out.pop("reasoning_content")
    elif role == "user" and content is None:
        raise invalid(f"missing required field 'messages[{i}].content'")
    return out


def _chat_tools(raw: list[Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """(the checked tools, notes): once per shared tool list (shared_values.py)."""
    notes: list[str] = []
    return _tools(raw, notes), notes


def _tools(tools: list[Any], notes: list[str]) -> list[dict[str, Any]]:
    out = []
    for j, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise invalid(f"tools[{j}] must be an object")
        if tool.get("type", "function") != "function":
            notes.append(f"dropped tool of type {tool.get('type')!r}")
            continue
        fn = require(tool, "function", dict, f"tools[{j}].")
        require(fn, "name", str, f"tools[{j}].function.")
        out.append({"type": "function", "function": fn})
    return out


def to_chat(body: dict[str, Any]) -> ChatRequest:
    if not isinstance(body, dict):
        raise invalid("request body must be a JSON object")
    model = require(body, "model", str)
    raw_messages = require(body, "messages", list)
    if not raw_messages:
        raise invalid("field 'messages' must not be empty")
    notes: list[str] = []
    messages = [_message(m, i) for i, m in enumerate(raw_messages)]
    tools, tool_notes = SHARED.derive(optional(body, "tools", list) or [], "openai_chat.tools", _chat_tools)
    notes.extend(tool_notes)
    if body.get("functions"):  # a new list: `tools` may be shared by other calls
        tools = tools + [{"type": "function", "function": fn} for fn in body["functions"] if isinstance(fn, dict)]
    params: dict[str, Any] = {}
    for name, typ in _PASS_PARAMS.items():
        value = optional(body, name, typ)
        if value is not None:
            params[name] = value
    max_tokens = optional(body, "max_completion_tokens", int) or optional(body, "max_tokens", int)
    if max_tokens is not None:
        if max_tokens < 1:
            raise invalid("field 'max_tokens' must be at least 1")
        params["max_tokens"] = max_tokens
    stop = optional(body, "stop", (str, list))
    if stop:
        params["stop"] = [stop] if isinstance(stop, str) else stop
    n = optional(body, "n", int)
    if n is not None and n != 1:
        raise invalid("field 'n' must be 1: the gateway records one sample per call")
    if body.get("reasoning_effort"):
        notes.append(f"reasoning_effort={body['reasoning_effort']!r} not forwarded")
    stream = bool(optional(body, "stream", bool))
    stream_options = optional(body, "stream_options", dict) or {}
    return ChatRequest(
        model=model, messages=messages, tools=tools, params=params, stream=stream, notes=notes,
        extra={"include_usage": bool(stream_options.get("include_usage")),
               "logprobs": bool(body.get("logprobs"))},
    )


def _usage(result: ChatResult) -> dict[str, int]:
    return {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens,
            "total_tokens": result.prompt_tokens + result.completion_tokens}


def _message_out(result: ChatResult) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": result.message.get("content")}
    if result.tool_calls:
        msg["tool_calls"] = [
            {"id": c.get("id"), "type": "function",
             "function": {"name": c["function"]["name"], "arguments": c["function"].get("arguments") or "{}"}}
            for c in result.tool_calls
        ]
    if result.reasoning:
        msg["reasoning_content"] = result.reasoning
    return msg


def from_chat(result: ChatResult, req: ChatRequest) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "message": _message_out(result),
                              "finish_reason": result.finish_reason, "logprobs": None}
    if req.extra.get("logprobs"):
        choice["logprobs"] = (result.raw.get("choices") or [{}])[0].get("logprobs")
    return {"id": result.id, "object": "chat.completion", "created": result.created or int(time.time()),
            "model": req.model, "choices": [choice], "usage": _usage(result)}


class ChatTranslator(StreamTranslator):
    """Normalised events -> chat.completion.chunk frames (the upstream's own dialect, re-labelled
    with the client's model name). A tool call whose arguments never came gets "{}": clients
    JSON-parse the arguments."""

    def __init__(self, req: ChatRequest):
        super().__init__(req)
        self.base: dict[str, Any] = {}
        self.args_sent: dict[int, bool] = {}

    def chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        return sse({**self.base, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                              "finish_reason": finish}]})

    def on_start(self, event: StreamEvent) -> Iterator[bytes]:
        self.base = {"id": event.id or "chatcmpl-" + uuid.uuid4().hex, "object": "chat.completion.chunk",
                     "created": event.created or int(time.time()), "model": self.req.model}
        yield self.chunk({"role": "assistant", "content": ""})

    def on_reasoning(self, event: StreamEvent) -> Iterator[bytes]:
        if event.text:
            yield self.chunk({"reasoning_content": event.text})

    def on_text(self, event: StreamEvent) -> Iterator[bytes]:
        if event.text:
            yield self.chunk({"content": event.text})

    def _close_args(self) -> Iterator[bytes]:
        for index, sent in self.args_sent.items():
            if not sent:
                yield self.chunk({"tool_calls": [{"index": index, "function": {"arguments": "{}"}}]})
                self.args_sent[index] = True

    def on_tool_start(self, event: StreamEvent) -> Iterator[bytes]:
        yield from self._close_args()
        self.args_sent[event.index] = False
        yield self.chunk({"tool_calls": [{"index": event.index, "id": event.id, "type": "function",
                                          "function": {"name": event.name or "", "arguments": ""}}]})

    def on_tool_args(self, event: StreamEvent) -> Iterator[bytes]:
        if event.text:
            self.args_sent[event.index] = True
            yield self.chunk({"tool_calls": [{"index": event.index, "function": {"arguments": event.text}}]})

    def on_finish(self, result: ChatResult) -> Iterator[bytes]:
        yield from self._close_args()
        yield self.chunk({}, result.finish_reason)
        if self.req.extra.get("include_usage"):
            yield sse({**self.base, "choices": [], "usage": _usage(result)})
        yield b"data: [DONE]\n\n"

    def error(self, err: GatewayError) -> Iterator[bytes]:
        return stream_error(err, self.req)


stream_translator = ChatTranslator
# A whole result as a chunk stream (synthetic streams): the same translator, replayed.
stream_events = replayed(ChatTranslator)


def stream_error(err: GatewayError, req: ChatRequest) -> Iterator[bytes]:
    yield sse({"error": error_object(err)})
    yield b"data: [DONE]\n\n"


def count_tokens_response(n: int) -> dict[str, Any]:
    return {"object": "token_count", "input_tokens": n}
