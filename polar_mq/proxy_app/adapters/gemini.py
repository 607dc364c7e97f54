"""Google Gemini `generateContent` / `streamGenerateContent` / `countTokens` <-> OpenAI chat.

Routes served (under `/v1beta/models/<model>:...` and `/v1/models/<model>:...`): the model name comes
from the URL, so `to_chat` accepts an optional `model` key in the body but does not require it; when
it is absent `ChatRequest.model` is "" and the gateway fills it in from the URL.

Hooks where Gemini differs from the protocol's defaults (see base.Adapter):
- `req.extra["alt"]`: the gateway copies the `alt` query argument here. `stream_events` writes SSE
  (`data: JSON` frames, no event lines, no [DONE]) when it is "sse" and otherwise the JSON array
  Google sends to a streaming client that did not ask for SSE. `stream_content_type(req)` gives the
  matching Content-Type and `stream_ping(req)` the keep-alive bytes: a bare newline, because
  google-genai (Python) fails on an SSE comment such as base.PING.
- `count_request_body(body)`: a `:countTokens` body is either `{contents, ...}` or
  `{generateContentRequest: {...}}`; this returns the generateContent-shaped part to feed `to_chat`.

Thought round trip: Gemini clients echo `thoughtSignature` and some (Gemini CLI) strip thought parts
from history. So the signature we emit *is* the reasoning text (the token of reasoning.py): it rides on the first functionCall part, else the first answer text part, else the first thought
part, and on the way back a signature of ours restores the assistant's exact reasoning even when the
thought parts were dropped. Foreign signatures (real Google ones, Gemini CLI's synthetic
"skip_thought_signature_validator") are ignored.

Tool-call ids: the client's `functionCall.id` when given; otherwise a positional id
(`call_<content>_<part>`), unique within the conversation and identical on every replay of the same
history, so the upstream prompt stays a token prefix of the next one. `functionResponse`s without an
id take the oldest unanswered call of the same name (else the oldest unanswered call).

Tests: tests/adapters/test_gemini.py, tests/adapters/test_adapter_kit.py, tests/gateway/test_round_trips.py.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Iterator

from polar_mq.proxy_app.adapters.base import (ChatRequest, ChatResult, GatewayError, StreamEvent, StreamTranslator,
                                              checked, dump_arguments, invalid, parse_arguments, replayed, sse)
# The protocol defaults this adapter keeps (base.Adapter), re-exported as its own hooks.
from polar_mq.proxy_app.adapters.base import error_in_stream as error_in_stream
from polar_mq.proxy_app.shared_values import SHARED
from polar_mq.proxy_app.adapters.reasoning import decode_reasoning, encode_reasoning

PROVIDER = "gemini"

# Server-side tools Gemini runs itself; a local model cannot, so they are dropped (and noted).
_SERVER_TOOLS = (
    "googleSearch", "googleSearchRetrieval", "codeExecution", "urlContext", "computerUse",
    "fileSearch", "googleMaps", "retrieval", "enterpriseWebSearch",
)

_STREAM_CHUNK = 32  # characters of text per streamed part

# Gateway error kind -> Google RPC status name.
_STATUS_NAME = {
    "invalid_request": "INVALID_ARGUMENT",
    "context_length": "INVALID_ARGUMENT",
    "too_large": "INVALID_ARGUMENT",
    "authentication": "UNAUTHENTICATED",
    "permission": "PERMISSION_DENIED",
    "not_found": "NOT_FOUND",
    "rate_limit": "RESOURCE_EXHAUSTED",
    "upstream_error": "INTERNAL",
    "upstream_unavailable": "UNAVAILABLE",
    "store_unavailable": "UNAVAILABLE",
    "upstream_timeout": "DEADLINE_EXCEEDED",
    "internal": "INTERNAL",
}

_FINISH = {"stop": "STOP", "tool_calls": "STOP", "function_call": "STOP", "length": "MAX_TOKENS",
           "content_filter": "SAFETY"}


# --------------------------------------------------------------------------------------------
# Field access: the REST API is camelCase, but google-genai dicts and hand-written clients use
# snake_case too; accept both everywhere.
# --------------------------------------------------------------------------------------------

def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _get(obj: dict[str, Any], name: str) -> Any:
    """`obj[name]` under its camelCase or snake_case spelling (None when absent)."""
    value = obj.get(name)
    if value is None:
        value = obj.get(_snake(name))
    return value


def _typed(obj: dict[str, Any], name: str, typ: type | tuple[type, ...], where: str) -> Any:
    """An optional field, under either spelling, checked for type; the 400 names it by its path."""
    return checked(_get(obj, name), f"{where}{name}", typ)


def _number(obj: dict[str, Any], name: str, where: str) -> float | int | None:
    return checked(_get(obj, name), f"{where}{name}", (int, float))


# --------------------------------------------------------------------------------------------
# Schemas
# --------------------------------------------------------------------------------------------

_SCHEMA_CHILDREN = ("properties", "patternProperties", "$defs", "definitions")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONE = ("items", "additionalProperties", "not")


def _sub_schemas(key: str, value: Any, convert: Callable[[Any], Any]) -> Any:
    """`value` of schema keyword `key` with the sub-schemas it holds converted; property names
    are user data and never renamed; a keyword without sub-schemas is returned as it is."""
    if key in _SCHEMA_CHILDREN and isinstance(value, dict):
        return {k: convert(v) for k, v in value.items()}
    if key in _SCHEMA_LISTS or key in _SCHEMA_ONE:
        return convert(value)
    return value


def openapi_to_json_schema(schema: Any) -> Any:
    """Gemini's OpenAPI-subset Schema (upper-case types, `nullable`, `propertyOrdering`) as JSON
    Schema. Keys are also accepted in snake_case (google-genai dumps)."""
    if isinstance(schema, list):
        return [openapi_to_json_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    nullable = False
    for key, value in schema.items():
        camel = re.sub(r"_([a-z])", lambda m: m.group(1).upper(), key)
        if camel in ("propertyOrdering", "example"):
            continue
        if camel == "nullable":
            nullable = bool(value)
            continue
        if camel == "type":
            out["type"] = value.lower() if isinstance(value, str) else value
            if out["type"] == "type_unspecified":
                del out["type"]
        else:
            out[camel] = _sub_schemas(camel, value, openapi_to_json_schema)
    if nullable:
        kind = out.get("type")
        if isinstance(kind, str):
            out["type"] = [kind, "null"]
        elif "anyOf" in out:
            out["anyOf"] = [*out["anyOf"], {"type": "null"}]
    return out


_OPENAPI_TYPES = {"STRING", "NUMBER", "INTEGER", "BOOLEAN", "ARRAY", "OBJECT", "NULL"}


def lower_openapi_types(schema: Any) -> Any:
    """A JSON-schema spelling that still carries OpenAPI upper-case type names (Gemini CLI sends
    `responseJsonSchema: {"type": "OBJECT", ...}`) with those names lower-cased; everything else,
    property names included, untouched."""
    if isinstance(schema, list):
        return [lower_openapi_types(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "type" and isinstance(value, str) and value in _OPENAPI_TYPES:
            out[key] = value.lower()
        elif key == "type" and isinstance(value, list):
            out[key] = [v.lower() if isinstance(v, str) and v in _OPENAPI_TYPES else v for v in value]
        else:
            out[key] = _sub_schemas(key, value, lower_openapi_types)
    return out


def _declaration_schema(decl: dict[str, Any], where: str) -> dict[str, Any]:
    """A functionDeclaration's parameters as JSON Schema: the JSON-schema spellings as is, the
    OpenAPI-subset `parameters` converted, nothing → an empty object schema."""
    raw = _get(decl, "parametersJsonSchema")  # also parameters_json_schema (google-genai)
    if raw is not None:
        if not isinstance(raw, dict):
            raise invalid(f"field '{where}parametersJsonSchema' must be an object")
        schema: dict[str, Any] = lower_openapi_types(raw)
        return schema
    params = _get(decl, "parameters")
    if params is None:
        return {"type": "object", "properties": {}}
    if not isinstance(params, dict):
        raise invalid(f"field '{where}parameters' must be an object")
    converted: dict[str, Any] = openapi_to_json_schema(params)
    return converted


# --------------------------------------------------------------------------------------------
# Request: Gemini -> OpenAI chat
# --------------------------------------------------------------------------------------------

def count_request_body(body: Any) -> dict[str, Any]:
    """The generateContent-shaped body inside a :countTokens request."""
    if not isinstance(body, dict):
        raise invalid("request body must be a JSON object")
    inner = _get(body, "generateContentRequest")
    if inner is None:
        inner = body
    elif not isinstance(inner, dict):
        raise invalid("field 'generateContentRequest' must be an object")
    return {"model": "count", **inner}  # the model is in the URL, not in a count body


def to_chat(body: Any) -> ChatRequest:
    """A GenerateContentRequest as an OpenAI chat request."""
    if not isinstance(body, dict):
        raise invalid("request body must be a JSON object")
    notes: list[str] = []
    model = _typed(body, "model", str, "") or ""
    if model.startswith("models/"):
        model = model[len("models/"):]
    messages = _system_messages(body)
    contents = _get(body, "contents")
    if contents is None:
        raise invalid("missing required field 'contents'")
    if isinstance(contents, dict):  # a single Content is accepted by the REST API too
        contents = [contents]
    if not isinstance(contents, list):
        raise invalid(f"field 'contents' must be an array, got {type(contents).__name__}")
    messages.extend(_contents_to_messages(contents, notes))
    if not messages:
        raise invalid("field 'contents' must not be empty")
    tools, tool_notes = SHARED.derive(_typed(body, "tools", list, ""), "gemini.tools", _tools)
    notes.extend(tool_notes)
    params, extra = _generation_params(body, notes)
    choice = _tool_choice(body, notes)
    if choice is not None and tools:
        params["tool_choice"] = choice
    for key in ("safetySettings", "cachedContent", "labels"):
        if _get(body, key) is not None:
            notes.append(f"ignored {key}")
    return ChatRequest(model=model, messages=messages, tools=tools, params=params,
                       notes=notes, extra=extra)


def _system_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    system = _get(body, "systemInstruction")
    if system is None:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}] if system else []
    if not isinstance(system, dict):
        raise invalid("field 'systemInstruction' must be an object (Content)")
    parts = _typed(system, "parts", list, "systemInstruction.") or []
    texts = []
    for i, part in enumerate(parts):
        if not isinstance(part, dict):
            raise invalid(f"field 'systemInstruction.parts[{i}]' must be an object")
        text = _typed(part, "text", str, f"systemInstruction.parts[{i}].")
        if text is not None:
            texts.append(text)
    text = "\n".join(texts)
    return [{"role": "system", "content": text}] if text else []


class _CallBook:
    """Tool-call ids issued for history functionCalls, answered in order by functionResponses."""

    def __init__(self) -> None:
        self.pending: list[tuple[str, str]] = []  # (id, name), oldest first
        self.seen: set[str] = set()

    def issue(self, given: Any, name: str, position: str) -> str:
        call_id = given if isinstance(given, str) and given else f"call_{position}"
        while call_id in self.seen:  # a client reusing ids must not merge two calls
            call_id += "_"
        self.seen.add(call_id)
        self.pending.append((call_id, name))
        return call_id

    def answer(self, given: Any, name: str, position: str) -> str:
        if isinstance(given, str) and given:
            for i, (pid, _) in enumerate(self.pending):
                if pid == given:
                    del self.pending[i]
                    break
            return given
        for i, (pid, pname) in enumerate(self.pending):
            if pname == name:
                del self.pending[i]
                return pid
        if self.pending:
            return self.pending.pop(0)[0]
        return f"call_{position}"


def _contents_to_messages(contents: list[Any], notes: list[str]) -> list[dict[str, Any]]:
    book = _CallBook()
    messages: list[dict[str, Any]] = []
    for ci, content in enumerate(contents):
        where = f"contents[{ci}]."
        if not isinstance(content, dict):
            raise invalid(f"field 'contents[{ci}]' must be an object")
        role = _typed(content, "role", str, where) or "user"
        parts = _typed(content, "parts", list, where)
        if parts is None:
            raise invalid(f"missing required field '{where}parts'")
        for pi, part in enumerate(parts):
            if not isinstance(part, dict):
                raise invalid(f"field '{where}parts[{pi}]' must be an object")
        if role == "model":
            messages.append(_model_message(parts, ci, book, notes))
        elif role in ("user", "function", "tool"):
            messages.extend(_user_messages(parts, ci, book, notes))
        else:
            raise invalid(f"field '{where}role' must be 'user' or 'model', got {role!r}")
    return messages


def _model_message(parts: list[dict[str, Any]], ci: int, book: _CallBook,
                   notes: list[str]) -> dict[str, Any]:
    """A `model` Content as one assistant message: text, reasoning and tool calls."""
    texts: list[str] = []
    thoughts: list[str] = []
    signed: str | None = None
    calls: list[dict[str, Any]] = []
    for pi, part in enumerate(parts):
        where = f"contents[{ci}].parts[{pi}]."
        if signed is None:
            signed = decode_reasoning(_get(part, "thoughtSignature"))
        call = _typed(part, "functionCall", dict, where)
        text = _typed(part, "text", str, where)
        if call is not None:
            name = _typed(call, "name", str, f"{where}functionCall.")
            if not name:
                raise invalid(f"missing required field '{where}functionCall.name'")
            args = _get(call, "args")
            if args is not None and not isinstance(args, dict):
                raise invalid(f"field '{where}functionCall.args' must be an object")
            call_id = book.issue(_get(call, "id"), name, f"{ci}_{pi}")
            calls.append({"id": call_id, "type": "function",
                          "function": {"name": name, "arguments": dump_arguments(args or {})}})
        elif text is not None:
            (thoughts if part.get("thought") is True else texts).append(text)
        elif part.get("thought") is True or _get(part, "thoughtSignature") is not None:
            continue  # a bare signature carrier
        else:
            notes.append(f"dropped unsupported model part {_part_kind(part)}")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    reasoning = signed if signed is not None else "".join(thoughts)
    if reasoning:
        message["reasoning"] = reasoning
    if calls:
        message["tool_calls"] = calls
    elif message["content"] is None:
        message["content"] = ""
    return message


def _user_messages(parts: list[dict[str, Any]], ci: int, book: _CallBook,
                   notes: list[str]) -> list[dict[str, Any]]:
    """A `user` Content: tool results first (they must follow the assistant's calls), then one
    user message with the remaining text and images."""
    tool_messages: list[dict[str, Any]] = []
    content: list[dict[str, Any]] = []
    for pi, part in enumerate(parts):
        where = f"contents[{ci}].parts[{pi}]."
        response = _typed(part, "functionResponse", dict, where)
        if response is not None:
            tool_messages.append(_tool_message(response, book, f"{ci}_{pi}", f"{where}functionResponse.",
                                               notes))
            continue
        text = _typed(part, "text", str, where)
        if text is not None:
            if part.get("thought") is True:
                notes.append("dropped thought part in a user turn")
            else:
                content.append({"type": "text", "text": text})
            continue
        image = _media_part(part, where, notes)
        if image is not None:
            content.append(image)
        elif not _is_media(part):
            notes.append(f"dropped unsupported user part {_part_kind(part)}")
    messages = list(tool_messages)
    if content:
        if all(p["type"] == "text" for p in content) and len(content) == 1:
            messages.append({"role": "user", "content": content[0]["text"]})
        else:
            messages.append({"role": "user", "content": content})
    elif not tool_messages:
        messages.append({"role": "user", "content": ""})
    return messages


def _tool_message(response: dict[str, Any], book: _CallBook, position: str, where: str,
                  notes: list[str]) -> dict[str, Any]:
    name = _typed(response, "name", str, where) or ""
    payload = _get(response, "response")
    if payload is not None and not isinstance(payload, dict):
        raise invalid(f"field '{where}response' must be an object")
    if _get(response, "parts"):
        notes.append("dropped media parts of a functionResponse")
    call_id = book.answer(_get(response, "id"), name, position)
    return {"role": "tool", "tool_call_id": call_id, "content": _tool_output(payload or {}, name)}


def _tool_output(payload: dict[str, Any], name: str) -> str:
    """The tool's output as the text the model reads. The clients wrap it: Gemini CLI in
    `{output}`, google-genai in `{result}`, the AI SDK (opencode) in `{name, content}`; a lone
    wrapped value is unwrapped (strings as is, other values as JSON), anything else is JSON."""
    inner = {k: v for k, v in payload.items() if not (k == "name" and v == name and len(payload) == 2)}
    if len(inner) == 1:
        (key, value), = inner.items()
        if key in ("output", "result", "content"):
            return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return json.dumps(payload, ensure_ascii=False)


def _is_media(part: dict[str, Any]) -> bool:
    return _get(part, "inlineData") is not None or _get(part, "fileData") is not None


def _media_part(part: dict[str, Any], where: str, notes: list[str]) -> dict[str, Any] | None:
    """inlineData / fileData images as OpenAI image_url parts; other media dropped and noted."""
    inline = _typed(part, "inlineData", dict, where)
    if inline is not None:
        mime = _typed(inline, "mimeType", str, f"{where}inlineData.") or ""
        data = _typed(inline, "data", str, f"{where}inlineData.")
        if data is None:
            raise invalid(f"missing required field '{where}inlineData.data'")
        if not mime.startswith("image/"):
            notes.append(f"dropped inlineData of type {mime or 'unknown'}")
            return None
        return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{data}"}}
    file = _typed(part, "fileData", dict, where)
    if file is not None:
        mime = _typed(file, "mimeType", str, f"{where}fileData.") or ""
        uri = _typed(file, "fileUri", str, f"{where}fileData.")
        if not uri:
            raise invalid(f"missing required field '{where}fileData.fileUri'")
        if mime and not mime.startswith("image/"):
            notes.append(f"dropped fileData of type {mime}")
            return None
        return {"type": "image_url", "image_url": {"url": uri}}
    return None


def _part_kind(part: dict[str, Any]) -> str:
    keys = [k for k in part if k not in ("thought", "thoughtSignature", "thought_signature")]
    return keys[0] if keys else "(empty)"


def _tools(raw: list[Any] | None) -> tuple[list[dict[str, Any]], list[str]]:
    """(chat tools, notes); once per shared tool list (shared_values.py)."""
    tools: list[dict[str, Any]] = []
    notes: list[str] = []
    for ti, tool in enumerate(raw or []):
        where = f"tools[{ti}]."
        if not isinstance(tool, dict):
            raise invalid(f"field 'tools[{ti}]' must be an object")
        decls = _typed(tool, "functionDeclarations", list, where) or []
        for di, decl in enumerate(decls):
            tools.append(_function_tool(decl, f"{where}functionDeclarations[{di}]"))
        for server in _SERVER_TOOLS:
            if _get(tool, server) is not None:
                notes.append(f"dropped server tool {server}")
    return tools, notes


def _function_tool(decl: Any, label: str) -> dict[str, Any]:
    if not isinstance(decl, dict):
        raise invalid(f"field '{label}' must be an object")
    name = _typed(decl, "name", str, f"{label}.")
    if not name:
        raise invalid(f"missing required field '{label}.name'")
    function: dict[str, Any] = {"name": name}
    description = _typed(decl, "description", str, f"{label}.")
    if description:
        function["description"] = description
    function["parameters"] = _declaration_schema(decl, f"{label}.")
    return {"type": "function", "function": function}


def _tool_choice(body: dict[str, Any], notes: list[str]) -> Any:
    config = _typed(body, "toolConfig", dict, "")
    if not config:
        return None
    fcc = _typed(config, "functionCallingConfig", dict, "toolConfig.")
    if not fcc:
        return None
    where = "toolConfig.functionCallingConfig."
    mode = (_typed(fcc, "mode", str, where) or "MODE_UNSPECIFIED").upper()
    allowed = _typed(fcc, "allowedFunctionNames", list, where) or []
    if mode == "NONE":
        return "none"
    if mode == "ANY":
        if len(allowed) == 1 and isinstance(allowed[0], str):
            return {"type": "function", "function": {"name": allowed[0]}}
        if allowed:
            notes.append("allowedFunctionNames not enforced (tool_choice=required)")
        return "required"
    if mode in ("AUTO", "VALIDATED"):
        if allowed:
            notes.append("allowedFunctionNames not enforced (tool_choice=auto)")
        if mode == "VALIDATED":
            notes.append("functionCallingConfig mode VALIDATED treated as AUTO")
        return "auto"
    if mode == "MODE_UNSPECIFIED":
        return None
    raise invalid(f"field '{where}mode' must be AUTO, ANY, NONE or VALIDATED, got {mode!r}")


def _generation_params(body: dict[str, Any], notes: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """generationConfig as upstream params; `extra` keeps what the response side needs."""
    params: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    config = _typed(body, "generationConfig", dict, "")
    if not config:
        return params, extra
    where = "generationConfig."
    count = _typed(config, "candidateCount", int, where)
    if count is not None and count > 1:
        raise invalid(f"field '{where}candidateCount' must be 1: only one candidate is supported")
    max_tokens = _typed(config, "maxOutputTokens", int, where)
    if max_tokens is not None:
        if max_tokens < 1:
            raise invalid(f"field '{where}maxOutputTokens' must be positive")
        params["max_tokens"] = max_tokens
    for src, dst in (("temperature", "temperature"), ("topP", "top_p"),
                     ("presencePenalty", "presence_penalty"),
                     ("frequencyPenalty", "frequency_penalty")):
        value = _number(config, src, where)
        if value is not None:
            params[dst] = value
    for src, dst in (("topK", "top_k"), ("seed", "seed")):
        value = _number(config, src, where)
        if value is not None:
            params[dst] = int(value)
    stop = _typed(config, "stopSequences", list, where)
    if stop:
        if not all(isinstance(s, str) for s in stop):
            raise invalid(f"field '{where}stopSequences' must be an array of strings")
        params["stop"] = stop
    response_format = _response_format(config, where, notes)
    if response_format is not None:
        params["response_format"] = response_format
    thinking = _typed(config, "thinkingConfig", dict, where)
    if thinking is not None:
        enable = _thinking_enabled(thinking)
        if enable is not None:
            params["chat_template_kwargs"] = {"enable_thinking": enable}
            notes.append(f"thinkingConfig mapped to enable_thinking={enable}")
        include = _get(thinking, "includeThoughts")
        if isinstance(include, bool):
            extra["include_thoughts"] = include
    for key in ("responseLogprobs", "logprobs", "speechConfig", "mediaResolution",
                "responseModalities"):
        if _get(config, key) is not None:
            notes.append(f"ignored generationConfig.{key}")
    return params, extra


def _thinking_enabled(thinking: dict[str, Any]) -> bool | None:
    budget = _get(thinking, "thinkingBudget")
    level = _get(thinking, "thinkingLevel")
    if isinstance(budget, (int, float)) and not isinstance(budget, bool):
        return budget != 0
    if isinstance(level, str) and level:
        return level.upper() not in ("MINIMAL", "THINKING_LEVEL_UNSPECIFIED")
    include = _get(thinking, "includeThoughts")
    if isinstance(include, bool):
        return include
    return None


def _response_format(config: dict[str, Any], where: str, notes: list[str]) -> dict[str, Any] | None:
    mime = _typed(config, "responseMimeType", str, where)
    json_schema = _get(config, "responseJsonSchema")
    schema = _get(config, "responseSchema")
    if json_schema is not None and not isinstance(json_schema, dict):
        raise invalid(f"field '{where}responseJsonSchema' must be an object")
    if schema is not None and not isinstance(schema, dict):
        raise invalid(f"field '{where}responseSchema' must be an object")
    if mime is None and json_schema is None and schema is None:
        return None
    if mime not in (None, "application/json", "text/plain"):
        notes.append(f"ignored responseMimeType {mime}")
        return None
    if mime == "text/plain":
        return None
    resolved = lower_openapi_types(json_schema) if json_schema is not None else (
        openapi_to_json_schema(schema) if schema is not None else None)
    if resolved is None:
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {"name": "response", "schema": resolved}}


# --------------------------------------------------------------------------------------------
# Response: OpenAI chat -> Gemini
# --------------------------------------------------------------------------------------------

_Parts = list[dict[str, Any]]


def _response_parts(result: ChatResult, req: ChatRequest) -> tuple[_Parts, _Parts, _Parts]:
    """(thought parts, text parts, functionCall parts) of the answer, signature attached."""
    reasoning = result.reasoning
    thoughts = [{"text": reasoning, "thought": True}] if reasoning and req.extra.get(
        "include_thoughts") is not False else []
    texts = [{"text": result.text}] if result.text else []
    calls = [_function_call_part(call) for call in result.tool_calls]
    if reasoning:
        carrier = (calls or texts or thoughts)
        if not carrier:  # thoughts hidden and nothing else: an empty text part carries it
            texts = [{"text": ""}]
            carrier = texts
        carrier[0]["thoughtSignature"] = encode_reasoning(reasoning)
    return thoughts, texts, calls


def _function_call_part(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function") or {}
    args = parse_arguments(function.get("arguments"))
    if not isinstance(args, dict):
        args = {"value": args}
    return {"functionCall": {"id": call.get("id") or "", "name": function.get("name") or "",
                             "args": args}}


def _usage(result: ChatResult) -> dict[str, int]:
    """usageMetadata: Gemini counts thoughts apart from candidates, so split when vLLM says how
    many completion tokens were reasoning."""
    usage = result.raw.get("usage") if isinstance(result.raw, dict) else None
    details = (usage or {}).get("completion_tokens_details") or {}
    thoughts = details.get("reasoning_tokens") or 0
    thoughts = thoughts if isinstance(thoughts, int) and 0 < thoughts <= result.completion_tokens else 0
    out = {"promptTokenCount": result.prompt_tokens,
           "candidatesTokenCount": result.completion_tokens - thoughts,
           "totalTokenCount": result.prompt_tokens + result.completion_tokens}
    if thoughts:
        out["thoughtsTokenCount"] = thoughts
    return out


def _finish(result: ChatResult) -> str:
    return _FINISH.get(result.finish_reason or "stop", "OTHER")


def _frame(parts: list[dict[str, Any]], result: ChatResult, req: ChatRequest,
           last: bool) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    body: dict[str, Any] = {"candidates": [candidate]}
    if last:
        candidate["finishReason"] = _finish(result)
        body["usageMetadata"] = _usage(result)
    body["modelVersion"] = req.model
    body["responseId"] = result.id
    return body


def from_chat(result: ChatResult, req: ChatRequest) -> dict[str, Any]:
    """A whole GenerateContentResponse."""
    thoughts, texts, calls = _response_parts(result, req)
    parts = thoughts + texts + calls or [{"text": ""}]
    return _frame(parts, result, req, last=True)


def _use_sse(req: ChatRequest) -> bool:
    return str(req.extra.get("alt", "sse")).lower() == "sse"


def stream_content_type(req: ChatRequest) -> str:
    """Content-Type of the stream: SSE for `alt=sse`, a JSON array otherwise."""
    return "text/event-stream" if _use_sse(req) else "application/json"


def stream_ping(req: ChatRequest) -> bytes:
    """Keep-alive bytes for this stream: a bare newline, in both modes. base.PING (an SSE comment)
    is not safe here: google-genai (Python) reads every non-`data:` line as raw JSON and fails on
    ": ping"; an empty line is skipped by it, by @google/genai (JS) and by SSE parsers, and is
    leading whitespace for a JSON array."""
    return b"\n"


class GeminiTranslator(StreamTranslator):
    """Normalised events -> GenerateContentResponse frames, SSE (`alt=sse`) or Google's streamed
    JSON array. Thought and text pieces go out as they come (never altered); functionCall parts are
    always whole, so they go out when the answer ends, in the last frame with finishReason and
    usageMetadata. One text/thought frame is held back so that the last one can carry the finish
    (and the thoughtSignature when no functionCall does)."""

    def __init__(self, req: ChatRequest):
        super().__init__(req)
        self.sse = _use_sse(req)
        self.response_id = ""
        self.held: dict[str, Any] | None = None  # the part of the frame held back
        self.sent = 0  # frames written (JSON-array mode needs to know the first)
        self.reasoning: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}  # index -> {"id", "name", "args": [pieces]}
        self.show_thoughts = req.extra.get("include_thoughts") is not False

    def _write(self, body: dict[str, Any]) -> bytes:
        self.sent += 1
        if self.sse:
            return sse(body)
        return (b"[" if self.sent == 1 else b",\r\n") + json.dumps(body, ensure_ascii=False).encode()

    def _frame(self, parts: list[dict[str, Any]], result: ChatResult | None = None) -> bytes:
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
        body: dict[str, Any] = {"candidates": [candidate]}
        if result is not None:
            candidate["finishReason"] = _finish(result)
            body["usageMetadata"] = _usage(result)
        body["modelVersion"] = self.req.model
        body["responseId"] = self.response_id
        return self._write(body)

    def _hold(self, part: dict[str, Any]) -> Iterator[bytes]:
        if self.held is not None:
            yield self._frame([self.held])
        self.held = part

    def on_start(self, event: StreamEvent) -> Iterator[bytes]:
        self.response_id = event.id or ""
        return iter(())

    def on_reasoning(self, event: StreamEvent) -> Iterator[bytes]:
        if not event.text:
            return
        self.reasoning.append(event.text)
        if self.show_thoughts:
            yield from self._hold({"text": event.text, "thought": True})

    def on_text(self, event: StreamEvent) -> Iterator[bytes]:
        if event.text:
            yield from self._hold({"text": event.text})

    def on_tool_start(self, event: StreamEvent) -> Iterator[bytes]:
        self.calls[event.index] = {"id": event.id or "", "name": event.name or "", "args": []}
        return iter(())

    def on_tool_args(self, event: StreamEvent) -> Iterator[bytes]:
        call = self.calls.get(event.index)
        if call is not None and event.text:
            call["args"].append(event.text)
        return iter(())

    def on_finish(self, result: ChatResult) -> Iterator[bytes]:
        calls = [_function_call_part({"id": c["id"], "function": {"name": c["name"],
                                                                  "arguments": "".join(c["args"])}})
                 for _, c in sorted(self.calls.items())]
        reasoning = "".join(self.reasoning)
        if calls:
            yield from self._hold_flush()
            if reasoning:
                calls[0]["thoughtSignature"] = encode_reasoning(reasoning)
            yield self._frame(calls, result)
        else:
            last = self.held
            self.held = None
            if last is None:
                last = {"text": ""}
            if reasoning:
                last["thoughtSignature"] = encode_reasoning(reasoning)
            yield self._frame([last], result)
        if not self.sse:
            yield b"]"

    def _hold_flush(self) -> Iterator[bytes]:
        if self.held is not None:
            yield self._frame([self.held])
            self.held = None

    def error(self, err: GatewayError) -> Iterator[bytes]:
        """After frames went out the error follows them: in JSON-array mode as the array's last
        element. The frame held back goes out first (it is what the model produced)."""
        yield from self._hold_flush()
        body = json.dumps(_error_body(err), ensure_ascii=False).encode()
        if self.sse:
            yield body + b"\n\n"
        else:
            yield (b"[" if self.sent == 0 else b",\r\n") + body + b"]"


stream_translator = GeminiTranslator
# `data: JSON` SSE frames (alt=sse), or Google's streamed JSON array without it; text pieces of at
# most 32 characters. Synthetic streams: the translator, replayed.
stream_events = replayed(GeminiTranslator, text_size=_STREAM_CHUNK)


# --------------------------------------------------------------------------------------------
# Errors and token counting
# --------------------------------------------------------------------------------------------

def _error_body(err: GatewayError) -> dict[str, Any]:
    message = err.message
    if err.kind == "context_length":
        prompt = err.detail.get("prompt_tokens")
        limit = err.detail.get("max_model_len")
        if prompt is not None and limit is not None:
            message = (f"The input token count ({prompt}) exceeds the maximum number of tokens "
                       f"allowed ({limit}).")
    return {"error": {"code": err.status, "message": message,
                      "status": _STATUS_NAME.get(err.kind, "INTERNAL")}}


def error_response(err: GatewayError) -> tuple[int, dict[str, Any]]:
    """Google's error shape: {"error": {"code", "message", "status"}}."""
    body = _error_body(err)
    return err.status, body


def stream_error(err: GatewayError, req: ChatRequest) -> Iterator[bytes]:
    """An error after the 200 went out. With SSE it is the bare error object on its own line, as
    Google sends it: @google/genai (JS, Gemini CLI) only raises on a chunk that parses as JSON
    with an `error` key, and google-genai (Python) raises on a raw JSON line starting with
    {"error":. This is the error before any frame (in JSON-array mode the whole array); the
    translator's `error` handles one after frames went out."""
    body = json.dumps(_error_body(err), ensure_ascii=False).encode()
    if _use_sse(req):
        yield body + b"\n\n"
    else:
        yield b"[" + body + b"]"


def count_tokens_response(n: int) -> dict[str, Any]:
    return {"totalTokens": n}
