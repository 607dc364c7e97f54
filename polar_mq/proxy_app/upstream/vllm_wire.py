"""vLLM 0.32's OpenAI-compatible wire format, as the gateway reads it: no I/O here.

What a chat completion answer means (token ids, logprobs, the normalised assistant message), how
a stream's chunks accumulate into the same answer and which normalised events each adds, how a
stream's SSE bytes split into `data:` payloads, and how vLLM's 4xx messages map to the gateway's
errors. The pool that talks to the servers (retries, affinity, health) is upstream.py.

Tests: tests/gateway/test_sse_parser.py, tests/gateway/test_token_ids.py; tests/vllm/test_contract.py.
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any, Callable, Iterator, Sequence

from polar_mq._io.token_ids import TokenIds, as_ids
from polar_mq.proxy_app.fastjson import CUT, loads_cut
from polar_mq.proxy_app.adapters.base import (REASONING, START, TEXT, TOOL_ARGS, TOOL_START, ChatResult, GatewayError,
                                              StreamEvent)

_MAX_LEN_RE = re.compile(r"maximum context length is (\d+)")
# vLLM has worded the prompt size several ways across versions.
_PROMPT_LEN_RES = [re.compile(p) for p in (r"(\d+) input tokens", r"resulted in (\d+) tokens",
                                           r"requested (\d+) tokens", r"prompt \(length (\d+)\)")]
_CONTEXT_WORDS = ("maximum context length", "context length", "too long", "exceeds the max")


CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"


_PROMPT_IDS_KEY = re.compile(rb'"prompt_token_ids"\s*:\s*\[')


def load_answer(data: bytes, loads: Callable[[bytes], Any]) -> Any:
    """A vLLM answer carrying the prompt's ids (a stream's first chunk, or a plain answer's body),
    parsed by `loads`, with its `prompt_token_ids` (top level for chat, in the choice for
    completions) kept as text: a TokenIds (token_ids.py) instead of a list of Python ints, which
    cost CPU in proportion to the prompt and which nothing on the gateway's path needs. The
    array is cut out of the bytes before parsing (fastjson.loads_cut) and put back
    where the cut lands, when that is one of those two places; a chunk whose ids are anything but
    compact non-negative integers (vLLM's form), or whose cut landed anywhere else, is parsed as
    it is. (A key inside a JSON string cannot match: its quotes are escaped there.)"""
    match = _PROMPT_IDS_KEY.search(data)
    if match is None:
        return loads(data)
    end = data.find(b"]", match.end())
    ids = TokenIds.from_array_text(data[match.end():end]) if end > 0 else None
    if ids is None:
        return loads(data)
    chunk = loads_cut(data, match.end() - 1, end + 1, loads)
    if not isinstance(chunk, dict):
        return loads(data)
    if chunk.get("prompt_token_ids") == CUT:
        chunk["prompt_token_ids"] = ids
        return chunk
    for choice in chunk.get("choices") or []:
        if isinstance(choice, dict) and choice.get("prompt_token_ids") == CUT:
            choice["prompt_token_ids"] = ids
            return chunk
    return loads(data)  # the array was somewhere else: parse the chunk as it came


def _prompt_ids(chunk: dict[str, Any]) -> Sequence[int] | None:
    """The prompt ids of a first stream chunk: top level for chat, in the choice for completions."""
    if chunk.get("prompt_token_ids") is not None:
        return chunk["prompt_token_ids"]
    for choice in chunk.get("choices") or []:
        if isinstance(choice, dict) and choice.get("prompt_token_ids") is not None:
            return choice["prompt_token_ids"]
    return None


def normalise_message(message: dict[str, Any]) -> dict[str, Any]:
    """The assistant message as recorded: `reasoning` (vLLM's older `reasoning_content` renamed),
    keys the upstream sent as null (refusal, audio, ...) and an empty tool_calls list dropped,
    `content` always present. A streamed answer accumulates to exactly this shape."""
    out = dict(message)
    if "reasoning_content" in out and not out.get("reasoning"):
        out["reasoning"] = out.pop("reasoning_content")
    out.pop("reasoning_content", None)
    out = {k: v for k, v in out.items() if v is not None or k == "content"}
    out.setdefault("role", "assistant")
    out.setdefault("content", None)
    if not out.get("tool_calls"):
        out.pop("tool_calls", None)
    if not out.get("reasoning"):
        out.pop("reasoning", None)
    return out


def parse_chat_response(data: dict[str, Any]) -> ChatResult:
    """vLLM chat completion JSON → ChatResult (token ids and logprobs pulled out)."""
    try:
        choice = data["choices"][0]
        message = dict(choice.get("message") or {})
    except (KeyError, IndexError, TypeError) as exc:
        raise GatewayError("upstream_error", f"upstream answer has no choices: {exc}") from exc
    message = normalise_message(message)
    logprobs = None
    content = (choice.get("logprobs") or {}).get("content")
    if content is not None:
        logprobs = [float(entry.get("logprob", 0.0)) for entry in content]
    usage = data.get("usage") or {}
    prompt_ids = data.get("prompt_token_ids")
    completion_ids = choice.get("token_ids")
    return ChatResult(
        id=data.get("id") or "chatcmpl-unknown",
        model=data.get("model") or "",
        message=message,
        finish_reason=choice.get("finish_reason") or "stop",
        prompt_token_ids=as_ids(prompt_ids) if prompt_ids is not None else None,
        completion_token_ids=list(completion_ids) if completion_ids is not None else None,
        logprobs=logprobs,
        prompt_tokens=int(usage.get("prompt_tokens") or len(prompt_ids or [])),
        completion_tokens=int(usage.get("completion_tokens") or len(completion_ids or [])),
        created=int(data.get("created") or time.time()),
        raw=data,
    )


TOKEN_GAP = 0.25  # s without a token: longer than a decode step, shorter than any weight sync


class StreamAccumulator:
    """Builds the ChatResult of a streamed vLLM chat completion chunk by chunk, and says what each
    chunk added as normalised stream events. The one place that knows vLLM's chunk format: the
    first chunk carries `prompt_token_ids`, every token's chunk its `token_ids` and `logprobs`,
    tool calls come as a header delta (index, id, name) then argument pieces, the last token's
    chunk the finish_reason (and stop_reason), a final `choices: []` chunk the usage."""

    def __init__(self) -> None:
        self.id = ""
        self.model = ""
        self.created = 0
        self.started = False
        self.prompt_ids: Sequence[int] | None = None
        self.ids: list[int] = []
        self.ids_seen = False
        self.logprobs: list[float] = []
        self.logprob_entries: list[dict[str, Any]] = []
        self.logprobs_seen = False
        self.reasoning: list[str] = []
        self.text: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}  # upstream index -> {"pos", "id", "name", "args"}
        self.finish_reason: str | None = None
        self.stop_reason: Any = None
        self.usage: dict[str, Any] = {}
        self.chunks = 0
        # (offset of the first token after a pause in the token flow, unix arrival time): where a
        # stream may have changed weights (proxy_app/versions.py); ordinary decode gaps stay under
        # TOKEN_GAP so an ordinary stream records none.
        self.gaps: list[tuple[int, float]] = []
        self._last_token_at = 0.0

    def feed(self, chunk: dict[str, Any]) -> list[StreamEvent]:
        error = chunk_error(chunk)
        if error is not None:
            raise GatewayError("upstream_error", f"upstream failed mid-stream: {error}")
        self.chunks += 1
        events: list[StreamEvent] = []
        if chunk.get("prompt_token_ids") is not None and self.prompt_ids is None:
            self.prompt_ids = as_ids(chunk["prompt_token_ids"])
        if not self.started:
            self.started = True
            self.id = chunk.get("id") or f"chatcmpl-{uuid.uuid4().hex}"
            self.model = chunk.get("model") or ""
            self.created = int(chunk.get("created") or time.time())
            events.append(StreamEvent(START, id=self.id, model=self.model, created=self.created,
                                      prompt_tokens=len(self.prompt_ids or [])))
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            events.extend(self._delta(choice.get("delta") or {}))
            if choice.get("token_ids") is not None:
                self.ids_seen = True
                now = time.time()
                if self._last_token_at and now - self._last_token_at >= TOKEN_GAP:
                    self.gaps.append((len(self.ids), now))
                self._last_token_at = now
                self.ids.extend(choice["token_ids"])
            content = (choice.get("logprobs") or {}).get("content")
            if content is not None:
                self.logprobs_seen = True
                self.logprob_entries.extend(content)
                self.logprobs.extend(float(e.get("logprob", 0.0)) for e in content)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
                self.stop_reason = choice.get("stop_reason")
        return events

    def _delta(self, delta: dict[str, Any]) -> Iterator[StreamEvent]:
        reasoning = delta.get("reasoning") or delta.get("reasoning_content")
        if reasoning:
            self.reasoning.append(reasoning)
            yield StreamEvent(REASONING, text=reasoning)
        if delta.get("content"):
            self.text.append(delta["content"])
            yield StreamEvent(TEXT, text=delta["content"])
        for tc in delta.get("tool_calls") or []:
            if not isinstance(tc, dict):
                continue
            index = tc.get("index")
            index = index if isinstance(index, int) else len(self.calls)
            fn = tc.get("function") or {}
            call = self.calls.get(index)
            if call is None:  # ids clients see and ids recorded must be the same: never leave one out
                call = self.calls[index] = {"pos": len(self.calls), "id": tc.get("id") or
                                            f"chatcmpl-tool-{uuid.uuid4().hex}",
                                            "name": fn.get("name") or "", "args": []}
                yield StreamEvent(TOOL_START, index=call["pos"], id=call["id"], name=call["name"])
            if fn.get("arguments"):
                call["args"].append(fn["arguments"])
                yield StreamEvent(TOOL_ARGS, index=call["pos"], text=fn["arguments"])

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def message(self) -> dict[str, Any]:
        text, reasoning = "".join(self.text), "".join(self.reasoning)
        calls = [{"id": c["id"], "type": "function",
                  "function": {"name": c["name"], "arguments": "".join(c["args"])}}
                 for c in sorted(self.calls.values(), key=lambda c: c["pos"])]
        msg: dict[str, Any] = {"role": "assistant",
                               "content": text if text or not (calls or reasoning) else None}
        if reasoning:
            msg["reasoning"] = reasoning
        if calls:
            msg["tool_calls"] = calls
        return msg

    def result(self) -> ChatResult:
        """What arrived, as a ChatResult (also for a stream that broke: finish_reason then is "")."""
        message = self.message()
        completion_ids = list(self.ids) if self.ids_seen else None
        choice = {"index": 0, "message": message, "finish_reason": self.finish_reason,
                  "stop_reason": self.stop_reason, "token_ids": completion_ids,
                  "logprobs": {"content": self.logprob_entries} if self.logprobs_seen else None}
        raw = {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
               "choices": [choice], "usage": self.usage, "prompt_token_ids": self.prompt_ids}
        notes = []
        expected = self.usage.get("completion_tokens")
        if self.ids_seen and isinstance(expected, int) and expected != len(self.ids):
            notes.append(f"streamed token ids incomplete: {len(self.ids)} ids for {expected} "
                         f"completion tokens")
        return ChatResult(
            id=self.id, model=self.model, message=message, finish_reason=self.finish_reason or "",
            prompt_token_ids=self.prompt_ids, completion_token_ids=completion_ids,
            logprobs=list(self.logprobs) if self.logprobs_seen else None,
            prompt_tokens=int(self.usage.get("prompt_tokens") or len(self.prompt_ids or [])),
            completion_tokens=int(expected or len(self.ids)), created=self.created, raw=raw, notes=notes)


def chunk_error(chunk: Any) -> str | None:
    """The message of an error sent inside a stream (vLLM: {"error": {...}}; older: a flat
    {"object": "error", "message"}); None for a normal chunk."""
    if not isinstance(chunk, dict):
        return f"malformed chunk {chunk!r:.200}"
    err = chunk.get("error")
    if isinstance(err, dict):
        return str(err.get("message") or err)
    if isinstance(err, str):
        return err
    if chunk.get("object") == "error":
        return str(chunk.get("message") or chunk)
    return None


def map_client_error(status: int, message: str) -> GatewayError:
    """A 4xx from the upstream as the gateway error the client should see."""
    lowered = message.lower()
    if any(word in lowered for word in _CONTEXT_WORDS):
        detail: dict[str, Any] = {}
        m = _MAX_LEN_RE.search(message)
        if m:
            detail["max_model_len"] = int(m.group(1))
        for regex in _PROMPT_LEN_RES:
            m = regex.search(message)
            if m:
                detail["prompt_tokens"] = int(m.group(1))
                break
        return GatewayError("context_length", message, detail=detail)
    if status == 404:
        return GatewayError("not_found", f"upstream: {message}")
    if status == 429:
        return GatewayError("rate_limit", f"upstream: {message}")
    return GatewayError("invalid_request", f"upstream rejected the request: {message}", status=400)


class SseParser:
    """SSE bytes in, `data:` payloads out (multi-line data joined; comments, event: and id:
    lines carry nothing for completions). Lines are cut by position from one buffer: splitting
    off each line copied the rest of the buffer once per line (quadratic in the lines a read
    brings, and a first chunk with 20k prompt ids spans several reads)."""

    def __init__(self) -> None:
        self._buf = b""
        self._pos = 0  # where the unread part of _buf starts
        self._scanned = 0  # no newline in _buf[_pos:_scanned]
        self._data: list[bytes] = []
        self._partial: list[bytes] = []  # pieces without a newline, joined when the line ends

    def feed(self, piece: bytes) -> Iterator[bytes]:
        if piece.find(b"\n") < 0:  # the line goes on: appending to _buf copied it per piece
            self._partial.append(piece)
            return
        if self._partial:
            self._partial.append(piece)
            piece, self._partial = b"".join(self._partial), []
        if self._pos:
            self._buf, self._scanned = self._buf[self._pos:] + piece, self._scanned - self._pos
            self._pos = 0
        else:
            self._buf += piece
        while True:
            end = self._buf.find(b"\n", self._scanned)
            if end < 0:
                self._scanned = len(self._buf)
                return
            line = self._buf[self._pos:end]
            self._pos = self._scanned = end + 1
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if self._data:
                    data, self._data = b"\n".join(self._data), []
                    yield data
            elif line.startswith(b"data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(b" ") else value)

    def end(self) -> Iterator[bytes]:
        """The body ended: a last payload without its blank line still counts."""
        self._partial = []  # a last line without its newline counts for nothing
        if self._data:
            data, self._data = b"\n".join(self._data), []
            yield data
