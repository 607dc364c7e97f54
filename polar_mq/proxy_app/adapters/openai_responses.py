"""OpenAI Responses API adapter (Codex CLI, opencode, pi, the openai SDK).

The Responses API is item based: `input` is a list of messages, tool calls, tool outputs and
reasoning items, and the answer is a list of output items. This module turns that into one
OpenAI-chat conversation for the upstream and turns the upstream's single assistant message back
into output items, non-streaming or as the typed, sequence-numbered event stream clients parse.

We are stateless: `previous_response_id` / `conversation` are refused (clients with `store: false`,
like Codex, always resend the whole history). Reasoning is handed back inside `encrypted_content`
as our own readable token (reasoning.py), so the exact reasoning text returns upstream on the next
turn.

Tests: tests/adapters/test_openai_responses.py, tests/adapters/test_adapter_kit.py.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Iterator

from polar_mq.proxy_app.adapters.base import (ChatRequest, ChatResult, GatewayError, StreamEvent, StreamTranslator,
                                              dump_arguments, invalid, optional, parse_arguments, replayed, require,
                                              sse)
# The protocol defaults this adapter keeps (base.Adapter), re-exported as its own hooks.
from polar_mq.proxy_app.adapters.base import (count_request_body as count_request_body,
                                              stream_content_type as stream_content_type, stream_ping as stream_ping)
from polar_mq.proxy_app.shared_values import SHARED
from polar_mq.proxy_app.adapters.openai_errors import error_object
from polar_mq.proxy_app.adapters.openai_errors import error_response as error_response
from polar_mq.proxy_app.adapters.reasoning import decode_reasoning, encode_reasoning

PROVIDER = "openai_responses"

# Hosted tools run by OpenAI's servers; a local model cannot run them, so they are dropped.
BUILTIN_TOOL_TYPES = {
    "web_search", "web_search_preview", "web_search_2025_08_26", "web_search_preview_2025_03_11",
    "file_search", "code_interpreter", "local_shell", "image_generation", "mcp",
    "computer_use_preview", "computer_use", "shell", "apply_patch", "tool_search",
}
# Items describing server-side tool activity; without the server they carry nothing to replay.
SERVER_ITEM_TYPES = {
    "web_search_call", "file_search_call", "code_interpreter_call", "image_generation_call",
    "computer_call", "computer_call_output", "mcp_list_tools", "mcp_call", "mcp_approval_request",
    "mcp_approval_response", "local_shell_call", "local_shell_call_output", "shell_call",
    "shell_call_output", "apply_patch_call", "apply_patch_call_output", "compaction",
    "tool_search_call", "tool_search_output",
}
STATELESS_FIELDS = ("previous_response_id", "conversation", "prompt")
MESSAGE_ROLES = {"user", "assistant", "system", "developer"}

# ------------------------------------------------------------------ request side


def to_chat(body: dict[str, Any]) -> ChatRequest:
    """A Responses request body as a normalised OpenAI-chat request."""
    if not isinstance(body, dict):
        raise invalid("request body must be a JSON object")
    model = require(body, "model", str)
    for name in STATELESS_FIELDS:
        if body.get(name):
            raise invalid(f"'{name}' is not supported: this gateway is stateless and stores no "
                          "responses; resend the full conversation in 'input' (store: false)")
    stream = bool(optional(body, "stream", bool))
    notes: list[str] = []
    messages = _instruction_messages(body, notes)
    messages += _input_messages(body, notes)
    if not messages:
        raise invalid("'input' must contain at least one item")
    tools, custom, tool_notes = SHARED.derive(optional(body, "tools", list) or [], "openai_responses.tools",
                                              _tools)
    notes.extend(tool_notes)
    params = _params(body, tools, custom, notes)
    extra = {"response_id": "resp_" + uuid.uuid4().hex, "echo": _echo(body)}
    return ChatRequest(model=model, messages=messages, tools=tools, params=params, stream=stream,
                       notes=notes, custom_tools=custom, extra=extra)


def _instruction_messages(body: dict[str, Any], notes: list[str]) -> list[dict[str, Any]]:
    """`instructions` becomes the leading system message."""
    instructions = optional(body, "instructions", (str, list))
    if instructions is None or instructions == "":
        return []
    if isinstance(instructions, str):
        return [{"role": "system", "content": instructions}]
    return _Conversation(notes, "instructions").run(instructions)


def _input_messages(body: dict[str, Any], notes: list[str]) -> list[dict[str, Any]]:
    """`input` as chat messages: a string is one user message, a list is converted item by item."""
    value = body.get("input")
    if value is None:
        raise invalid("missing required field 'input'")
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise invalid(f"field 'input' must be a string or an array, got {type(value).__name__}")
    return _Conversation(notes, "input").run(value)


class _Conversation:
    """Builds chat messages from Responses items, folding a reasoning item, an assistant message
    and the function calls that follow it into one assistant turn (the shape the model produced)."""

    def __init__(self, notes: list[str], field: str):
        self.notes = notes
        self.field = field
        self.messages: list[dict[str, Any]] = []
        self.turn: dict[str, Any] | None = None  # the assistant turn being assembled

    def run(self, items: list[Any]) -> list[dict[str, Any]]:
        for i, item in enumerate(items):
            where = f"{self.field}[{i}]"
            if not isinstance(item, dict):
                raise invalid(f"'{where}' must be an object, got {type(item).__name__}")
            self._item(item, where)
        self._flush()
        return self.messages

    def _item(self, item: dict[str, Any], where: str) -> None:
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            self._message(item, where)
        elif kind == "reasoning":
            self._reasoning(item, where)
        elif kind in ("function_call", "custom_tool_call"):
            self._tool_call(item, kind, where)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            self._tool_output(item, where)
        elif kind == "item_reference":
            self.notes.append(f"skipped {where} item_reference (no stored items in a stateless gateway)")
        elif kind in SERVER_ITEM_TYPES:
            self.notes.append(f"skipped {where} server-side item {kind}")
        elif kind is None:
            raise invalid(f"missing required field '{where}.type'")
        else:
            raise invalid(f"unsupported item type {kind!r} at '{where}.type'")

    def _message(self, item: dict[str, Any], where: str) -> None:
        role = require(item, "role", str, f"{where}.")
        if role not in MESSAGE_ROLES:
            raise invalid(f"field '{where}.role' must be one of {sorted(MESSAGE_ROLES)}, got {role!r}")
        content = _content(item.get("content"), f"{where}.content")
        if role != "assistant":
            self._flush()
            self.messages.append({"role": "system" if role == "developer" else role, "content": content})
            return
        turn = self.turn
        if turn is not None and (turn.get("tool_calls") or "content" in turn):
            self._flush()
        self._turn()["content"] = content

    def _reasoning(self, item: dict[str, Any], where: str) -> None:
        text = _reasoning_text(item, where)
        if text is None:
            self.notes.append(f"dropped {where} reasoning without readable text")
            return
        if self.turn is not None:
            self._flush()
        self._turn()["reasoning"] = text

    def _tool_call(self, item: dict[str, Any], kind: str, where: str) -> None:
        call_id = require(item, "call_id", str, f"{where}.")
        name = require(item, "name", str, f"{where}.")
        if isinstance(item.get("namespace"), str) and item["namespace"]:
            name = f"{item['namespace']}.{name}"  # as the model saw and called it (_namespace_tools)
        if kind == "custom_tool_call":
            arguments = dump_arguments({"input": require(item, "input", str, f"{where}.")})
        else:
            arguments = dump_arguments(require(item, "arguments", (str, dict), f"{where}."))
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        self._turn().setdefault("tool_calls", []).append(call)

    def _tool_output(self, item: dict[str, Any], where: str) -> None:
        self._flush()
        call_id = require(item, "call_id", str, f"{where}.")
        output = item.get("output")
        if output is None:
            raise invalid(f"missing required field '{where}.output'")
        self.messages.append({"role": "tool", "tool_call_id": call_id,
                              "content": _content(output, f"{where}.output")})

    def _turn(self) -> dict[str, Any]:
        if self.turn is None:
            self.turn = {"role": "assistant"}
        return self.turn

    def _flush(self) -> None:
        """Close the assistant turn: content is None beside tool calls, "" when nothing was said."""
        turn, self.turn = self.turn, None
        if turn is None:
            return
        if "content" not in turn:
            turn["content"] = None if turn.get("tool_calls") else ""
        ordered = {"role": "assistant", "content": turn["content"]}
        if "reasoning" in turn:
            ordered["reasoning"] = turn["reasoning"]
        if turn.get("tool_calls"):
            ordered["tool_calls"] = turn["tool_calls"]
        self.messages.append(ordered)


def _reasoning_text(item: dict[str, Any], where: str) -> str | None:
    """Exact text from our own token first, then full reasoning content, then the summary."""
    text = decode_reasoning(item.get("encrypted_content"))
    if text is not None:
        return text
    for key, part_type in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = optional(item, key, list, f"{where}.")
        texts = [p["text"] for p in parts or [] if isinstance(p, dict) and p.get("type") == part_type
                 and isinstance(p.get("text"), str)]
        if texts:
            return "\n\n".join(texts)
    return None


def _content(value: Any, where: str) -> Any:
    """Message / tool-output content as chat content: a string stays a string, a single text part
    becomes its string, anything else a list of chat parts (text is never rejoined or altered)."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if not isinstance(value, list):
        raise invalid(f"field '{where}' must be a string or an array, got {type(value).__name__}")
    parts = [part for j, p in enumerate(value) if (part := _part(p, f"{where}[{j}]")) is not None]
    if len(parts) == 1 and parts[0]["type"] == "text":
        return parts[0]["text"]
    return parts


def _part(part: Any, where: str) -> dict[str, Any] | None:
    """One Responses content part as an OpenAI-chat content part."""
    if isinstance(part, str):
        return {"type": "text", "text": part}
    if not isinstance(part, dict):
        raise invalid(f"'{where}' must be an object, got {type(part).__name__}")
    kind = require(part, "type", str, f"{where}.")
    if kind in ("input_text", "output_text", "text", "summary_text", "reasoning_text"):
        return {"type": "text", "text": require(part, "text", str, f"{where}.")}
    if kind == "refusal":
        return {"type": "text", "text": require(part, "refusal", str, f"{where}.")}
    if kind == "input_image":
        return _image_part(part, where)
    if kind == "input_file":
        return _file_part(part, where)
    raise invalid(f"unsupported content part type {kind!r} at '{where}.type'")


def _image_part(part: dict[str, Any], where: str) -> dict[str, Any]:
    url = optional(part, "image_url", str, f"{where}.")
    if not url:
        raise invalid(f"'{where}' needs 'image_url' (a URL or data URL); file_id needs stored files, "
                      "which this gateway does not have")
    image = {"url": url}
    if part.get("detail") in ("low", "high", "auto"):
        image["detail"] = part["detail"]
    return {"type": "image_url", "image_url": image}


def _file_part(part: dict[str, Any], where: str) -> dict[str, Any]:
    data = optional(part, "file_data", str, f"{where}.")
    if not data:
        raise invalid(f"'{where}' needs 'file_data'; file_id and file_url are not supported")
    file = {"file_data": data}
    if isinstance(part.get("filename"), str):
        file["filename"] = part["filename"]
    return {"type": "file", "file": file}


# ------------------------------------------------------------------ tools and parameters


def _tools(raw: list[Any]) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """(chat tools, custom tool names, notes). Function tools pass through; custom tools become
    one-string-argument functions; hosted tools are dropped (and noted). Once per shared tool
    list (shared_values.py): harnesses send the same tools on every call."""
    tools: list[dict[str, Any]] = []
    custom: list[str] = []
    notes: list[str] = []
    for i, tool in enumerate(raw):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise invalid(f"'{where}' must be an object, got {type(tool).__name__}")
        kind = require(tool, "type", str, f"{where}.")
        if kind == "function":
            tools.append(_function_tool(tool, where))
        elif kind == "custom":
            tools.append(_custom_tool(tool, where))
            custom.append(tool["name"])
        elif kind == "namespace":
            tools.extend(_namespace_tools(tool, where, notes))
        else:
            notes.append(f"dropped {'server' if kind in BUILTIN_TOOL_TYPES else 'unsupported'} "
                         f"tool {kind}")
    return tools, custom, notes


def _function_tool(tool: dict[str, Any], where: str) -> dict[str, Any]:
    name = require(tool, "name", str, f"{where}.")
    parameters = optional(tool, "parameters", dict, f"{where}.") or {"type": "object", "properties": {}}
    function: dict[str, Any] = {"name": name}
    if isinstance(tool.get("description"), str):
        function["description"] = tool["description"]
    function["parameters"] = parameters
    return {"type": "function", "function": function}


def _namespace_tools(tool: dict[str, Any], where: str, notes: list[str]) -> list[dict[str, Any]]:
    """A namespace's function tools (Codex's ``multi_agent_v1``: ``spawn_agent``, ...) as chat
    functions named ``NAMESPACE.NAME``: a dot cannot occur in a Responses function name, so the
    answer's call splits back into ``namespace`` and ``name`` unambiguously (``_split_name``;
    tests/adapters/test_responses_namespace.py)."""
    namespace = require(tool, "name", str, f"{where}.")
    out = []
    for j, sub in enumerate(optional(tool, "tools", list, f"{where}.") or []):
        if isinstance(sub, dict) and sub.get("type", "function") == "function":
            fn = _function_tool(sub, f"{where}.tools[{j}]")
            fn["function"]["name"] = f"{namespace}.{fn['function']['name']}"
            out.append(fn)
        else:
            notes.append(f"dropped tool {namespace}.{sub.get('name') if isinstance(sub, dict) else j} "
                         "(not a function)")
    return out


def _split_name(name: str) -> dict[str, str]:
    """``{"name"}``, or ``{"name", "namespace"}`` for a namespaced tool (_namespace_tools)."""
    if "." in name:
        namespace, _, bare = name.rpartition(".")
        return {"name": bare, "namespace": namespace}
    return {"name": name}


def _custom_tool(tool: dict[str, Any], where: str) -> dict[str, Any]:
    """A free-form (e.g. grammar-constrained apply_patch) tool as a function taking `input`.
    The grammar goes into the description: the model has no other way to learn the format."""
    name = require(tool, "name", str, f"{where}.")
    description = tool["description"] if isinstance(tool.get("description"), str) else ""
    fmt = optional(tool, "format", dict, f"{where}.") or {}
    if fmt.get("type") == "grammar" and isinstance(fmt.get("definition"), str):
        syntax = fmt.get("syntax") or "grammar"
        description += f"\n\nThe input must follow this {syntax} grammar:\n{fmt['definition']}"
    parameters = {
        "type": "object",
        "properties": {"input": {"type": "string", "description": f"The raw input for {name}."}},
        "required": ["input"],
    }
    return {"type": "function", "function": {"name": name, "description": description.strip(),
                                             "parameters": parameters}}


def _params(body: dict[str, Any], tools: list[dict[str, Any]], custom: list[str],
            notes: list[str]) -> dict[str, Any]:
    """Sampling and tool settings in OpenAI-chat vocabulary."""
    params: dict[str, Any] = {}
    max_tokens = optional(body, "max_output_tokens", int)
    if max_tokens is not None:
        params["max_tokens"] = max_tokens
    for name in ("temperature", "top_p"):
        value = optional(body, name, (int, float))
        if value is not None:
            params[name] = value
    if tools:
        choice = _tool_choice(body.get("tool_choice"), {t["function"]["name"] for t in tools}, notes)
        if choice is not None:
            params["tool_choice"] = choice
        parallel = optional(body, "parallel_tool_calls", bool)
        if parallel is not None:
            params["parallel_tool_calls"] = parallel
    elif body.get("tool_choice") not in (None, "auto", "none"):
        notes.append("dropped tool_choice: no usable tools")
    response_format = _response_format(body)
    if response_format is not None:
        params["response_format"] = response_format
    effort = _reasoning_effort(body)
    if effort is not None:
        kwargs: dict[str, Any] = {"reasoning_effort": effort}
        if effort == "none":
            kwargs["enable_thinking"] = False
        params["chat_template_kwargs"] = kwargs
        notes.append(f"reasoning.effort={effort} passed as chat_template_kwargs")
    return params


def _tool_choice(choice: Any, names: set[str], notes: list[str]) -> Any:
    """Responses tool_choice as chat tool_choice."""
    if choice is None:
        return None
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise invalid(f"field 'tool_choice' must be auto, none or required, got {choice!r}")
        return choice
    if not isinstance(choice, dict):
        raise invalid(f"field 'tool_choice' must be a string or an object, got {type(choice).__name__}")
    kind = choice.get("type")
    if kind in ("function", "custom"):
        name = require(choice, "name", str, "tool_choice.")
        if name not in names:
            raise invalid(f"'tool_choice.name' names unknown tool {name!r}")
        return {"type": "function", "function": {"name": name}}
    if kind == "allowed_tools":
        mode = choice.get("mode") if choice.get("mode") in ("auto", "required") else "auto"
        notes.append(f"tool_choice allowed_tools approximated as {mode}")
        return mode
    notes.append(f"dropped tool_choice of type {kind}")
    return None


def _response_format(body: dict[str, Any]) -> dict[str, Any] | None:
    """`text.format` as chat response_format."""
    text = optional(body, "text", dict)
    fmt = optional(text or {}, "format", dict, "text.")
    if not fmt or fmt.get("type") in (None, "text"):
        return None
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    if fmt["type"] != "json_schema":
        raise invalid(f"unsupported 'text.format.type' {fmt['type']!r}")
    schema = require(fmt, "schema", dict, "text.format.")
    spec: dict[str, Any] = {"name": fmt.get("name") or "response", "schema": schema}
    for key in ("strict", "description"):
        if fmt.get(key) is not None:
            spec[key] = fmt[key]
    return {"type": "json_schema", "json_schema": spec}


def _reasoning_effort(body: dict[str, Any]) -> str | None:
    reasoning = optional(body, "reasoning", dict)
    return optional(reasoning or {}, "effort", str, "reasoning.")


def _echo(body: dict[str, Any]) -> dict[str, Any]:
    """Request fields a Response object repeats back (the SDK types require some of them)."""
    text: dict[str, Any] = body["text"] if isinstance(body.get("text"), dict) else {}
    return {
        "instructions": body.get("instructions") if isinstance(body.get("instructions"), (str, list)) else None,
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") or {},
        "parallel_tool_calls": body.get("parallel_tool_calls", True) is not False,
        "reasoning": body.get("reasoning") if isinstance(body.get("reasoning"), dict) else None,
        "store": body.get("store", True) is not False,
        "temperature": body.get("temperature"),
        "text": {**text, "format": text.get("format") or {"type": "text"}},
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": [t for t in body.get("tools") or [] if isinstance(t, dict)],
        "top_p": body.get("top_p"),
        "truncation": body.get("truncation") or "disabled",
        "user": body.get("user"),
    }


# ------------------------------------------------------------------ response side


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def output_items(result: ChatResult, req: ChatRequest) -> list[dict[str, Any]]:
    """The upstream message as finished output items: reasoning, message, then tool calls.
    A turn with nothing at all still yields an empty message, so the client records the turn."""
    items: list[dict[str, Any]] = []
    if result.reasoning:
        items.append({"id": _new_id("rs"), "type": "reasoning",
                      "summary": [{"type": "summary_text", "text": result.reasoning}],
                      "encrypted_content": encode_reasoning(result.reasoning)})
    status = "incomplete" if result.finish_reason == "length" else "completed"
    if result.text or not result.tool_calls:
        items.append({"id": _new_id("msg"), "type": "message", "role": "assistant", "status": status,
                      "content": [{"type": "output_text", "text": result.text, "annotations": [],
                                   "logprobs": []}]})
    for call in result.tool_calls:
        items.append(_call_item(call, req, status))
    return items


def _call_item(call: dict[str, Any], req: ChatRequest, status: str) -> dict[str, Any]:
    function = call.get("function") or {}
    name = function.get("name") or ""
    arguments = dump_arguments(function.get("arguments"))
    call_id = call.get("id") or _new_id("call")
    if name in req.custom_tools:
        return {"id": _new_id("ctc"), "type": "custom_tool_call", "call_id": call_id, "name": name,
                "input": _custom_input(arguments), "status": status}
    return {"id": _new_id("fc"), "type": "function_call", "call_id": call_id, **_split_name(name),
            "arguments": arguments, "status": status}


def _custom_input(arguments: str) -> str:
    """The free-form input of a custom tool call: the `input` argument, else the raw arguments."""
    parsed = parse_arguments(arguments)
    if isinstance(parsed, dict) and isinstance(parsed.get("input"), str):
        return str(parsed["input"])
    return arguments


def _usage(result: ChatResult) -> dict[str, Any]:
    details = (result.raw.get("usage") or {}).get("completion_tokens_details") or {}
    reasoning_tokens = details.get("reasoning_tokens") if isinstance(details, dict) else None
    return {
        "input_tokens": result.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": result.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens if isinstance(reasoning_tokens, int) else 0},
        "total_tokens": result.prompt_tokens + result.completion_tokens,
    }


def _response(req: ChatRequest, *, status: str, output: list[dict[str, Any]],
              created_at: int, usage: dict[str, Any] | None = None,
              error: dict[str, Any] | None = None, incomplete: bool = False) -> dict[str, Any]:
    """A Response object around `output`, echoing the request's settings."""
    return {
        "id": req.extra.get("response_id") or _new_id("resp"),
        "object": "response",
        "created_at": created_at,
        "status": status,
        "background": False,
        "error": error,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "model": req.model,
        "output": output,
        "previous_response_id": None,
        "usage": usage,
        **req.extra.get("echo", _echo({})),
    }


def from_chat(result: ChatResult, req: ChatRequest) -> dict[str, Any]:
    """The whole answer as a Response object."""
    incomplete = result.finish_reason == "length"
    return _response(req, status="incomplete" if incomplete else "completed",
                     output=output_items(result, req), created_at=result.created or int(time.time()),
                     usage=_usage(result), incomplete=incomplete)


# ------------------------------------------------------------------ streaming


class _Stream:
    """Numbers the events of one response; kept on the request so an error after the stream began
    continues the same sequence and the same response id."""

    def __init__(self, req: ChatRequest):
        self.req = req
        self.seq = 0
        self.created = False
        self.created_at = int(time.time())

    @classmethod
    def of(cls, req: ChatRequest) -> "_Stream":
        state = req.extra.get("_stream")
        if not isinstance(state, cls):
            state = req.extra["_stream"] = cls(req)
        return state

    def event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return sse(data, event=kind)

    def start(self) -> Iterator[bytes]:
        """response.created and response.in_progress, once."""
        if self.created:
            return
        self.created = True
        shell = _response(self.req, status="in_progress", output=[], created_at=self.created_at)
        yield self.event("response.created", response=shell)
        yield self.event("response.in_progress", response=shell)


class ResponsesTranslator(StreamTranslator):
    """Normalised events -> the Responses event stream. Output items open in the order the model
    produces them (reasoning, message, tool calls); an item is finished (`output_item.done`) when
    the next one opens or the answer ends, and `response.completed` lists exactly the finished
    items. Custom tool calls (apply_patch) carry their free-form `input`, which sits inside the
    upstream's JSON arguments: it is sent whole when the call ends."""

    def __init__(self, req: ChatRequest):
        super().__init__(req)
        self.state = _Stream.of(req)
        self.items: list[dict[str, Any]] = []  # finished items
        self.item: dict[str, Any] | None = None  # the open item
        self.buffer: list[str] = []  # its text / arguments so far
        self.saw_message = False
        self.saw_call = False

    def on_start(self, event: StreamEvent) -> Iterator[bytes]:
        if event.created and not self.state.created:
            self.state.created_at = event.created
        yield from self.state.start()

    def _ids(self) -> dict[str, Any]:
        assert self.item is not None
        return {"item_id": self.item["id"], "output_index": len(self.items)}

    def _open(self, item: dict[str, Any], added: dict[str, Any]) -> Iterator[bytes]:
        yield from self._close("completed")
        self.item, self.buffer = item, []
        yield self.state.event("response.output_item.added", output_index=len(self.items), item=added)

    def _close(self, status: str) -> Iterator[bytes]:
        item = self.item
        if item is None:
            return
        ids = self._ids()
        text = "".join(self.buffer)
        kind = item["type"]
        if kind == "reasoning":
            part: dict[str, Any] = {"type": "summary_text", "text": text}
            item.update(summary=[part], encrypted_content=encode_reasoning(text))
            yield self.state.event("response.reasoning_summary_text.done", **ids, summary_index=0, text=text)
            yield self.state.event("response.reasoning_summary_part.done", **ids, summary_index=0, part=part)
        elif kind == "message":
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            item.update(status=status, content=[part])
            yield self.state.event("response.output_text.done", **ids, content_index=0, text=text, logprobs=[])
            yield self.state.event("response.content_part.done", **ids, content_index=0, part=part)
        elif kind == "function_call":
            item.update(arguments=text, status=status)
            yield self.state.event("response.function_call_arguments.done", **ids, name=item["name"],
                                   arguments=text)
        elif kind == "custom_tool_call":
            value = _custom_input(text)
            item.update(input=value, status=status)
            if value:
                yield self.state.event("response.custom_tool_call_input.delta", **ids, delta=value)
            yield self.state.event("response.custom_tool_call_input.done", **ids, input=value)
        yield self.state.event("response.output_item.done", output_index=len(self.items), item=item)
        self.items.append(item)
        self.item, self.buffer = None, []

    def on_reasoning(self, event: StreamEvent) -> Iterator[bytes]:
        if not event.text:
            return
        if self.item is None or self.item["type"] != "reasoning":
            item = {"id": _new_id("rs"), "type": "reasoning", "summary": []}
            yield from self._open(item, dict(item))
            yield self.state.event("response.reasoning_summary_part.added", **self._ids(), summary_index=0,
                                   part={"type": "summary_text", "text": ""})
        self.buffer.append(event.text)
        yield self.state.event("response.reasoning_summary_text.delta", **self._ids(), summary_index=0,
                               delta=event.text)

    def _open_message(self) -> Iterator[bytes]:
        item = {"id": _new_id("msg"), "type": "message", "role": "assistant", "status": "in_progress",
                "content": []}
        yield from self._open(item, dict(item))
        self.saw_message = True
        yield self.state.event("response.content_part.added", **self._ids(), content_index=0,
                               part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})

    def on_text(self, event: StreamEvent) -> Iterator[bytes]:
        if not event.text:
            return
        if self.item is None or self.item["type"] != "message":
            yield from self._open_message()
        self.buffer.append(event.text)
        yield self.state.event("response.output_text.delta", **self._ids(), content_index=0,
                               delta=event.text, logprobs=[])

    def on_tool_start(self, event: StreamEvent) -> Iterator[bytes]:
        name = event.name or ""
        call_id = event.id or _new_id("call")
        self.saw_call = True
        if name in self.req.custom_tools:
            item = {"id": _new_id("ctc"), "type": "custom_tool_call", "call_id": call_id, "name": name,
                    "input": "", "status": "in_progress"}
        else:
            item = {"id": _new_id("fc"), "type": "function_call", "call_id": call_id, **_split_name(name),
                    "arguments": "", "status": "in_progress"}
        yield from self._open(item, dict(item))

    def on_tool_args(self, event: StreamEvent) -> Iterator[bytes]:
        if self.item is None or not event.text or self.item["type"] not in ("function_call", "custom_tool_call"):
            return
        self.buffer.append(event.text)
        if self.item["type"] == "function_call":
            yield self.state.event("response.function_call_arguments.delta", **self._ids(), delta=event.text)

    def on_finish(self, result: ChatResult) -> Iterator[bytes]:
        incomplete = result.finish_reason == "length"
        status = "incomplete" if incomplete else "completed"
        if not self.saw_message and not self.saw_call:  # the client must see a turn, even empty
            yield from self._open_message()
        yield from self._close(status)
        final = _response(self.req, status=status, output=self.items, created_at=self.state.created_at,
                          usage=_usage(result), incomplete=incomplete)
        yield self.state.event("response.completed", response=final)

    def error(self, err: GatewayError) -> Iterator[bytes]:
        return stream_error(err, self.req)


stream_translator = ResponsesTranslator
# The answer as the Responses event stream, ending in response.completed (also for a
# length-truncated answer, whose response says status incomplete: clients treat a stream without
# response.completed as a failure and retry). Synthetic streams: the translator, replayed.
stream_events = replayed(ResponsesTranslator)


# ------------------------------------------------------------------ errors and count_tokens


def error_in_stream(err: GatewayError) -> bool:
    """Context overflow goes inside the stream: Codex reads `response.failed` with code
    context_length_exceeded as a context-window error (and stops retrying)."""
    return err.kind == "context_length"


def stream_error(err: GatewayError, req: ChatRequest) -> Iterator[bytes]:
    """A failure as events: response.created (unless already sent), an `error` event (the
    openai SDK raises APIError on its `error` object), then response.failed carrying
    response.error, which Codex, opencode and pi read."""
    state = _Stream.of(req)
    yield from state.start()
    error = error_object(err)
    code = error["code"] if err.kind in ("context_length", "rate_limit") else "server_error"
    if err.kind == "invalid_request":
        code = "invalid_prompt"
    yield state.event("error", code=code, message=err.message, param=error["param"], error=error)
    failed = _response(req, status="failed", output=[], created_at=state.created_at,
                       error={"code": code, "message": err.message})
    yield state.event("response.failed", response=failed)


def count_tokens_response(n: int) -> dict[str, Any]:
    """Body of the input-tokens route (POST /v1/responses/input_tokens)."""
    return {"object": "response.input_tokens", "input_tokens": n}
