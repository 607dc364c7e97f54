"""What every provider adapter shares: the normalised request/response types, the error type,
the stream translator, the field validators and the `Adapter` protocol with its defaults.

An adapter module (one per provider API, named as its provider in `model.PROVIDERS`; see
registry.py) is pure logic — no Flask, no Redis, no HTTP — and offers the `Adapter` protocol
below. `to_chat` raises `GatewayError("invalid_request", ...)` naming the offending field.

Streaming has one path per provider: the gateway turns the upstream's chunks into normalised
`StreamEvent`s (start, reasoning/text deltas, tool-call start, tool-argument deltas, finish) as they
arrive, and the adapter's translator turns each event into provider frames at once. A synthetic
stream (an upstream that cannot stream token ids) is the same translator fed by `replay(result)`.

Tests: tests/adapters/test_adapter_kit.py, tests/adapters/test_adapters_without_orjson.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Protocol, Sequence, TypeVar, Union, overload

from polar_mq._io import jsonsafe

# Error kinds and the HTTP status they carry unless a provider says otherwise.
ERROR_STATUS = {
    "invalid_request": 400,
    "authentication": 401,
    "permission": 403,
    "not_found": 404,
    "too_large": 413,
    "context_length": 400,
    "rate_limit": 429,
    "upstream_error": 502,
    "upstream_unavailable": 503,
    "store_unavailable": 503,
    "upstream_timeout": 504,
    "internal": 500,
}


class GatewayError(Exception):
    """A failure the gateway reports to the client in the client's own error shape."""

    def __init__(self, kind: str, message: str, *, status: int | None = None,
                 retryable: bool | None = None, detail: dict[str, Any] | None = None):
        super().__init__(message)
        if kind not in ERROR_STATUS:
            raise ValueError(f"unknown error kind {kind!r}")
        self.kind = kind
        self.message = message
        self.status = status or ERROR_STATUS[kind]
        self.retryable = retryable if retryable is not None else self.status >= 500 or self.status == 429
        self.detail = detail or {}

    def __repr__(self) -> str:
        return f"GatewayError({self.kind!r}, {self.message!r}, status={self.status})"


def invalid(message: str) -> GatewayError:
    return GatewayError("invalid_request", message)


@dataclass
class ChatRequest:
    """A provider request normalised to OpenAI chat, ready to go upstream."""

    model: str  # the model name the client asked for; echoed back to the client
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)  # [{"type": "function", "function": {...}}]
    # Upstream sampling / decoding parameters in OpenAI chat vocabulary: max_tokens, temperature,
    # top_p, top_k, stop, seed, response_format, tool_choice, parallel_tool_calls, ...
    params: dict[str, Any] = field(default_factory=dict)
    stream: bool = False
    notes: list[str] = field(default_factory=list)  # what was dropped or changed, kept in the record
    custom_tools: list[str] = field(default_factory=list)  # Responses custom tools (apply_patch)
    # Provider-specific context the response side needs (e.g. include_usage, thinking requested).
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class ChatResult:
    """The upstream's answer, normalised. `message` is an OpenAI assistant message
    (`content`, `tool_calls`, and `reasoning` when the model thought)."""

    id: str
    model: str
    message: dict[str, Any]
    finish_reason: str
    prompt_token_ids: Sequence[int] | None = None  # a list, or the stream's TokenIds (token_ids.py)
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    created: int = 0
    raw: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # copied into the capture record

    @property
    def text(self) -> str:
        return self.message.get("content") or ""

    @property
    def reasoning(self) -> str:
        return self.message.get("reasoning") or self.message.get("reasoning_content") or ""

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        return self.message.get("tool_calls") or []


# --------------------------------------------------------------------------------------------
# Normalised stream events
# --------------------------------------------------------------------------------------------

START, REASONING, TEXT, TOOL_START, TOOL_ARGS, FINISH = (
    "start", "reasoning", "text", "tool_start", "tool_args", "finish")


@dataclass
class StreamEvent:
    """One step of an answer as it is produced.

    start:      id, model, created, prompt_tokens (sent once, before anything else)
    reasoning:  text (a piece of the reasoning)
    text:       text (a piece of the answer)
    tool_start: index, id, name (a tool call begins; its arguments follow)
    tool_args:  index, text (a piece of the arguments JSON, as the upstream produced it)
    finish:     result (the whole ChatResult, already recorded)
    """

    kind: str
    text: str = ""
    index: int = 0
    id: str | None = None
    name: str | None = None
    model: str = ""
    created: int = 0
    prompt_tokens: int = 0
    result: "ChatResult | None" = None


def replay(result: ChatResult, text_size: int = 16, args_size: int = 64) -> Iterator[StreamEvent]:
    """A whole result as the events a real stream would have produced (synthetic streams).
    Pieces are cut without altering anything: joined they give back the exact text."""
    yield StreamEvent(START, id=result.id, model=result.model, created=result.created,
                      prompt_tokens=result.prompt_tokens or len(result.prompt_token_ids or []))
    for piece in chunk_text(result.reasoning, text_size):
        yield StreamEvent(REASONING, text=piece)
    for piece in chunk_text(result.text, text_size):
        yield StreamEvent(TEXT, text=piece)
    for index, call in enumerate(result.tool_calls):
        fn = call.get("function") or {}
        yield StreamEvent(TOOL_START, index=index, id=call.get("id"), name=fn.get("name") or "")
        args = fn.get("arguments")
        for piece in chunk_text("" if args is None or args == "" else dump_arguments(args), args_size):
            yield StreamEvent(TOOL_ARGS, index=index, text=piece)
    yield StreamEvent(FINISH, result=result)


class StreamTranslator:
    """Turns normalised events into one provider's frames, incrementally. Subclasses override the
    `on_*` handlers they need (each returns the frames to send now, possibly none; `on_finish`
    gets the whole, already recorded result) and `error`."""

    def __init__(self, req: ChatRequest):
        self.req = req
        self.started = False

    def feed(self, event: StreamEvent) -> Iterator[bytes]:
        if event.kind == START:
            if self.started:
                return
            self.started = True
            yield from self.on_start(event)
            return
        if not self.started:  # every stream begins with a start, even a replayed one
            yield from self.feed(StreamEvent(START))
        if event.kind == FINISH:
            assert event.result is not None, "a finish event carries the result"
            yield from self.on_finish(event.result)
            return
        handler = {REASONING: self.on_reasoning, TEXT: self.on_text, TOOL_START: self.on_tool_start,
                   TOOL_ARGS: self.on_tool_args}[event.kind]
        yield from handler(event)

    def feed_all(self, events: Iterable[StreamEvent]) -> Iterator[bytes]:
        for event in events:
            yield from self.feed(event)

    def _nothing(self, event: StreamEvent) -> Iterator[bytes]:
        return iter(())

    # Events a provider has no frame for produce nothing.
    on_start = on_reasoning = on_text = on_tool_start = on_tool_args = _nothing

    def on_finish(self, result: ChatResult) -> Iterator[bytes]:
        return iter(())

    def error(self, err: GatewayError) -> Iterator[bytes]:
        """The frames that end the stream with `err` (defaults to the adapter's stream_error)."""
        return iter(())


def sse(data: Any, event: str | None = None) -> bytes:
    """One server-sent-event frame. `data` is JSON-encoded unless it is already a string: with
    the one JSON writer (`jsonsafe.dumps`: orjson, the stdlib where orjson refuses or is absent;
    tests/adapters/test_adapters_without_orjson.py)."""
    payload = data.encode() if isinstance(data, str) else jsonsafe.dumps(data)
    return (b"event: " + event.encode() + b"\ndata: " if event else b"data: ") + payload + b"\n\n"


# A comment frame: every SSE parser (the official SDKs, the CLIs) ignores it, so it is safe to
# send before the first real event to keep idle connections alive during a long upstream call.
PING = b": ping\n\n"


def chunk_text(text: str, size: int = 16) -> Iterator[str]:
    """Split text into pieces without altering it: "".join(pieces) == text, always."""
    for i in range(0, len(text), size):
        yield text[i : i + size]


def parse_arguments(arguments: Any) -> Any:
    """Tool-call arguments as an object; upstream sends a JSON string."""
    if isinstance(arguments, (dict, list)):
        return arguments
    if not arguments:
        return {}
    try:
        return json.loads(arguments)
    except (TypeError, ValueError):
        return {"_raw": arguments}


# json.dumps(..., ensure_ascii=False) builds a new encoder on every call (its non-default options);
# one kept encoder writes the same text, and a Claude Code request's history of tool calls makes
# many such calls.
_ARGUMENTS = json.JSONEncoder(ensure_ascii=False)


def dump_arguments(arguments: Any) -> str:
    """Tool-call arguments as the JSON string OpenAI chat expects (json.dumps' text, exactly)."""
    if isinstance(arguments, str):
        return arguments
    return _ARGUMENTS.encode(arguments if arguments is not None else {})


_T = TypeVar("_T")
_U = TypeVar("_U")
_Types = Union[type, tuple[type, ...]]


@overload
def checked(value: Any, label: str, typ: type[_T]) -> _T | None: ...
@overload
def checked(value: Any, label: str, typ: tuple[type[_T], type[_U]]) -> _T | _U | None: ...
@overload
def checked(value: Any, label: str, typ: tuple[type, ...]) -> Any: ...
def checked(value: Any, label: str, typ: _Types) -> Any:
    """`value` when it is of type `typ` (None stays None; a bool never passes for a number),
    else a 400 that names the field `label`."""
    if value is None:
        return None
    if not isinstance(value, typ) or isinstance(value, bool) and bool not in _as_tuple(typ):
        raise invalid(f"field '{label}' must be {_type_name(typ)}, got {type(value).__name__}")
    return value


@overload
def require(body: dict[str, Any], name: str, typ: type[_T], where: str = "") -> _T: ...
@overload
def require(body: dict[str, Any], name: str, typ: tuple[type[_T], type[_U]], where: str = "") -> _T | _U: ...
def require(body: dict[str, Any], name: str, typ: Any, where: str = "") -> Any:
    """Fetch a required field, raising a 400 that names it when missing or of the wrong type."""
    if body.get(name) is None:
        raise invalid(f"missing required field '{where}{name}'")
    return checked(body[name], f"{where}{name}", typ)


@overload
def optional(body: dict[str, Any], name: str, typ: type[_T], where: str = "") -> _T | None: ...
@overload
def optional(body: dict[str, Any], name: str, typ: tuple[type[_T], type[_U]], where: str = "") -> _T | _U | None: ...
@overload
def optional(body: dict[str, Any], name: str, typ: tuple[type, ...], where: str = "") -> Any: ...
def optional(body: dict[str, Any], name: str, typ: Any, where: str = "") -> Any:
    """Fetch an optional field (None when absent), 400 naming it when of the wrong type."""
    return checked(body.get(name), f"{where}{name}", typ)


def _as_tuple(typ: _Types) -> tuple[type, ...]:
    return typ if isinstance(typ, tuple) else (typ,)


def _type_name(typ: _Types) -> str:
    names = {dict: "an object", list: "an array", str: "a string", int: "an integer",
             float: "a number", bool: "a boolean"}
    return " or ".join(names.get(t, t.__name__) for t in _as_tuple(typ))


# --------------------------------------------------------------------------------------------
# The adapter protocol and its defaults
# --------------------------------------------------------------------------------------------

class Adapter(Protocol):
    """What the gateway calls on an adapter module (a module satisfies it structurally; mypy checks
    every registered one, registry.py). Hooks most providers answer alike have a default below that
    a module re-exports (`from .base import stream_ping`), so the gateway never asks whether an
    adapter has a hook or which provider it is."""

    PROVIDER: str

    def to_chat(self, body: dict[str, Any]) -> ChatRequest:
        """Provider request -> normalised OpenAI chat; GatewayError("invalid_request") on bad input."""
        ...

    def from_chat(self, result: ChatResult, req: ChatRequest) -> dict[str, Any]:
        """The provider response body."""
        ...

    def stream_translator(self, req: ChatRequest) -> StreamTranslator:
        """Normalised events -> this provider's frames, for one stream."""
        ...

    def stream_events(self, result: ChatResult, req: ChatRequest) -> Iterator[bytes]:
        """A whole result as a stream (synthetic streams); default: `replayed(translator)`."""
        ...

    def stream_content_type(self, req: ChatRequest) -> str:
        """Content-Type of a stream; default: SSE."""
        ...

    def stream_ping(self, req: ChatRequest) -> bytes:
        """Keep-alive bytes sent while the upstream is quiet; default: PING."""
        ...

    def error_response(self, err: GatewayError) -> tuple[int, dict[str, Any]]:
        """(HTTP status, provider-shaped error body)."""
        ...

    def error_in_stream(self, err: GatewayError) -> bool:
        """True: report this error before the first frame as stream events, not as an HTTP
        status; default: never."""
        ...

    def stream_error(self, err: GatewayError, req: ChatRequest) -> Iterator[bytes]:
        """A stream that holds only this error."""
        ...

    def count_request_body(self, body: dict[str, Any]) -> dict[str, Any]:
        """A count-tokens body as a body `to_chat` accepts; default: unchanged."""
        ...

    def count_tokens_response(self, n: int) -> dict[str, Any]:
        """Body of the count-tokens route."""
        ...


def stream_content_type(req: ChatRequest) -> str:
    """Default: every stream is server-sent events."""
    return "text/event-stream"


def stream_ping(req: ChatRequest) -> bytes:
    """Default keep-alive: an SSE comment."""
    return PING


def error_in_stream(err: GatewayError) -> bool:
    """Default: before the first frame an HTTP status is better (the SDKs and CLIs retry on it)."""
    return False


def count_request_body(body: dict[str, Any]) -> dict[str, Any]:
    """Default: a count-tokens body is a generation body."""
    return body


def replayed(translator: Callable[[ChatRequest], StreamTranslator], *, text_size: int = 16
             ) -> Callable[[ChatResult, ChatRequest], Iterator[bytes]]:
    """The default `stream_events`: the adapter's own translator fed by `replay(result)`, so a
    synthetic stream is framed by exactly the code that frames a live one."""
    def stream_events(result: ChatResult, req: ChatRequest) -> Iterator[bytes]:
        return translator(req).feed_all(replay(result, text_size=text_size))
    return stream_events
