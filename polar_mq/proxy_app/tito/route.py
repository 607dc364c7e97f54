"""One continued call: generation from token ids through vLLM's `/v1/completions`.

Why `/v1/completions` with a token-id prompt and a local tokenizer, and not the
`--enable-scale-out` endpoints (`/v1/chat/completions/render`, `/inference/v1/generate`,
`/derender`): it is one HTTP round trip per call (render → generate → derender is three, and a
streamed derender is one more call per chunk, each carrying all ids so far: O(n²) bytes per
answer), it streams token ids and logprobs per chunk, it works on every vLLM that returns token ids
(no extra server flag, which `--tokens-only` deployments and older servers lack), and the tail of
the prompt must be rendered around the parent's ids anyway — the render endpoint renders whole
conversations only. The price is that the gateway parses tool calls and reasoning itself
(`parse.py`, vLLM's hermes + `<think>` rules), from the exact sampled ids.

The route looks like the upstream pool to the gateway (`chat`, `open_stream`, ...) and answers in
chat-completion shape, chunks included, so everything after it (stream accumulation, the
provider adapters, the record) is the messages path's code.

Tests: tests/tito/test_tito.py; tests/vllm/test_contract.py.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Iterator

from polar_mq.proxy_app.adapters.base import ChatResult
from polar_mq.proxy_app.upstream.pool import COMPLETIONS_PATH, IDLE, UpstreamPool, UpstreamStream, normalise_message
from polar_mq.proxy_app.tito.parse import StreamParser, parse_text, to_message
from polar_mq.proxy_app.tito.tokenizer import LocalTokenizer

# chat parameters that mean nothing to /v1/completions, or that the route sets itself
_CHAT_ONLY = {"messages", "tools", "tool_choice", "parallel_tool_calls", "response_format",
              "chat_template_kwargs", "logprobs", "top_logprobs", "stream_options",
              "return_token_ids", "max_completion_tokens", "max_tokens", "stream", "prompt",
              "continue_final_message", "add_generation_prompt", "reasoning_effort"}


class Detokenizer:
    """Incremental decoding as vLLM does it: a window of recent ids is decoded again with each new
    id, and text is released only when it no longer ends in an incomplete character."""

    def __init__(self, tok: LocalTokenizer):
        self.tok = tok
        self.ids: list[int] = []
        self.prefix = 0
        self.read = 0
        self.text = ""

    def add(self, ids: list[int]) -> str:
        self.ids.extend(ids)
        before = self.tok.decode(self.ids[self.prefix:self.read])
        now = self.tok.decode(self.ids[self.prefix:])
        if len(now) > len(before) and not now.endswith("\ufffd"):
            self.text += now[len(before):]
            self.prefix, self.read = self.read, len(self.ids)
        return self.text

    def flush(self) -> str:
        rest = self.tok.decode(self.ids[self.prefix:])
        before = self.tok.decode(self.ids[self.prefix:self.read])
        if len(rest) > len(before):
            self.text += rest[len(before):]
        self.prefix = self.read = len(self.ids)
        return self.text


def _chat_logprobs(lp: dict[str, Any] | None, start: int, n: int) -> list[dict[str, Any]] | None:
    """Completions logprobs (parallel lists) → chat logprob entries for ids [start, start+n)."""
    if not isinstance(lp, dict) or lp.get("token_logprobs") is None:
        return None
    tokens, values = lp.get("tokens") or [], lp.get("token_logprobs") or []
    tops = lp.get("top_logprobs") or []
    out = []
    for i in range(start, min(start + n, len(values))):
        token = tokens[i] if i < len(tokens) else ""
        top = tops[i] if i < len(tops) and isinstance(tops[i], dict) else {}
        out.append({"token": token, "logprob": float(values[i] if values[i] is not None else 0.0),
                    "bytes": list(str(token).encode("utf-8", errors="replace")),
                    "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode("utf-8", "replace"))}
                                     for t, v in top.items()]})
    return out


def completions_body(chat_body: dict[str, Any], prompt_ids: list[int], max_model_len: int | None,
                     stream: bool) -> dict[str, Any]:
    """The `/v1/completions` request for a chat request's sampling parameters and a token prompt."""
    body = {k: v for k, v in chat_body.items() if k not in _CHAT_ONLY}
    max_tokens = chat_body.get("max_completion_tokens") or chat_body.get("max_tokens")
    if max_tokens is None and max_model_len:
        # the chat path's default: whatever the window leaves (at least 1: an overlong prompt
        # then gets vLLM's own context-length error, as on the messages path)
        max_tokens = max(1, max_model_len - len(prompt_ids))
    body.update(prompt=prompt_ids, max_tokens=max_tokens, stream=stream,
                logprobs=chat_body.get("top_logprobs") or 0, return_token_ids=True,
                skip_special_tokens=False)
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


class TitoRoute:
    """Generation of one call from `prompt_ids`, answered as if it had been a chat completion."""

    def __init__(self, pool: UpstreamPool, tok: LocalTokenizer, prompt_ids: list[int], *,
                 parse_tools: bool, max_model_len: int | None):
        self.pool = pool
        self.tok = tok
        self.prompt_ids = prompt_ids
        self.parse_tools = parse_tools
        self.max_model_len = max_model_len
        self.special = sorted((tok.decode([i]) for i in tok.special_ids), key=len, reverse=True)

    # --- the request -----------------------------------------------------------------------------
    def completions_body(self, chat_body: dict[str, Any], stream: bool) -> dict[str, Any]:
        return completions_body(chat_body, self.prompt_ids, self.max_model_len, stream)

    # --- the answer ------------------------------------------------------------------------------
    def _message(self, ids: list[int], call_ids: list[str]) -> dict[str, Any]:
        body = ids[:-1] if ids and ids[-1] == self.tok.eos_token_id else ids
        parsed = parse_text(self.tok.decode(body), self.parse_tools, self.special)
        return normalise_message(to_message(parsed, call_ids))

    @staticmethod
    def _finish(reason: str | None, message: dict[str, Any]) -> str | None:
        return "tool_calls" if reason == "stop" and message.get("tool_calls") else reason

    def to_result(self, data: dict[str, Any]) -> ChatResult:
        choice = (data.get("choices") or [{}])[0]
        ids = list(choice.get("token_ids") or [])
        message = self._message(ids, [])
        finish = self._finish(choice.get("finish_reason") or "stop", message)
        logprobs = _chat_logprobs(choice.get("logprobs"), 0, len(ids))
        usage = data.get("usage") or {}
        prompt_ids = choice.get("prompt_token_ids")
        rid = "chatcmpl-" + str(data.get("id") or uuid.uuid4().hex).removeprefix("cmpl-")
        raw = {"id": rid, "object": "chat.completion", "created": data.get("created"),
               "model": data.get("model"), "usage": usage, "prompt_token_ids": prompt_ids,
               "choices": [{"index": 0, "message": message, "finish_reason": finish,
                            "stop_reason": choice.get("stop_reason"), "token_ids": ids,
                            "logprobs": {"content": logprobs} if logprobs is not None else None}]}
        return ChatResult(
            id=rid, model=data.get("model") or "", message=message, finish_reason=finish or "stop",
            prompt_token_ids=list(prompt_ids) if prompt_ids is not None else None,
            completion_token_ids=ids if choice.get("token_ids") is not None else None,
            logprobs=[e["logprob"] for e in logprobs] if logprobs is not None else None,
            prompt_tokens=int(usage.get("prompt_tokens") or len(prompt_ids or [])),
            completion_tokens=int(usage.get("completion_tokens") or len(ids)),
            created=int(data.get("created") or time.time()), raw=raw)

    # --- the pool's interface --------------------------------------------------------------------
    def chat(self, body: dict[str, Any], affinity_key: str) -> tuple[ChatResult, str]:
        return self.pool.post_json(COMPLETIONS_PATH, self.completions_body(body, False),
                                   affinity_key, self.to_result)

    def can_abort(self, affinity_key: str) -> bool:
        """Never: vLLM names a token-id completion `cmpl-<id>-0`, an internal detail the
        gateway does not rely on; its plain calls are streamed from the upstream instead."""
        return False

    def can_stream(self, affinity_key: str) -> bool:
        return self.pool.can_stream(affinity_key)

    def mark_no_stream_ids(self, url: str) -> None:
        self.pool.mark_no_stream_ids(url)

    def open_stream(self, body: dict[str, Any], affinity_key: str) -> "ChatChunks":
        stream = self.pool.open_stream(self.completions_body(body, True), affinity_key,
                                       path=COMPLETIONS_PATH)
        return ChatChunks(stream, self)


class ChatChunks:
    """A token-in completions stream, read as chat-completion chunks (what StreamAccumulator
    reads): a role chunk with the prompt ids, then per upstream chunk its token ids, logprobs and
    the message delta that became certain, the finish reason on the last, then the usage."""

    def __init__(self, stream: UpstreamStream, route: TitoRoute):
        self.stream = stream
        self.route = route
        self.url = stream.url

    def close(self) -> None:
        self.stream.close()

    def release(self) -> None:
        self.stream.release()

    def can_idle(self) -> bool:
        return self.stream.can_idle()

    def idle_every(self, seconds: float) -> None:
        self.stream.idle_every(seconds)

    def ready(self) -> bool:
        return self.stream.ready()

    @property
    def sees_socket(self) -> bool:
        return self.stream.sees_socket

    def chunks(self) -> Iterator[dict[str, Any]]:
        route, eos = self.route, self.route.tok.eos_token_id
        detok = Detokenizer(route.tok)
        parser = StreamParser(route.parse_tools, route.special)
        rid, started = None, False
        seen = 0
        for chunk in self.stream.chunks():
            if chunk is IDLE:
                yield chunk
                continue
            if chunk.get("error") is not None or chunk.get("object") == "error":
                yield chunk  # the accumulator raises the upstream's error
                return
            base = {"id": rid, "object": "chat.completion.chunk", "created": chunk.get("created"),
                    "model": chunk.get("model")}
            if not started:
                started = True
                rid = base["id"] = "chatcmpl-" + str(chunk.get("id") or uuid.uuid4().hex).removeprefix("cmpl-")
                first = (chunk.get("choices") or [{}])[0]
                yield dict(base, prompt_token_ids=first.get("prompt_token_ids"),
                           choices=[{"index": 0, "delta": {"role": "assistant", "content": ""},
                                     "logprobs": None, "finish_reason": None}])
            if chunk.get("usage") and not chunk.get("choices"):
                yield dict(base, choices=[], usage=chunk["usage"])
                continue
            for choice in chunk.get("choices") or []:
                if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                    continue
                ids = list(choice.get("token_ids") or [])
                finish = choice.get("finish_reason")
                text_ids = ids[:-1] if finish and ids and ids[-1] == eos else ids
                text = detok.add(text_ids)
                if finish:
                    text = detok.flush()
                deltas = parser.step(text, final=bool(finish))
                delta: dict[str, Any] = {}
                for d in deltas:
                    for k, v in d.items():
                        if k == "tool_calls":
                            delta.setdefault("tool_calls", []).extend(v)
                        else:
                            delta[k] = delta.get(k, "") + v
                lp = _chat_logprobs(choice.get("logprobs"), 0, len(ids))
                out = {"index": 0, "delta": delta, "token_ids": ids,
                       "logprobs": {"content": lp} if lp is not None else None, "finish_reason": None}
                seen += len(ids)
                if finish:
                    message = {"tool_calls": parser.sent.calls} if parser.sent.calls else {}
                    out["finish_reason"] = route._finish(finish, message)
                    out["stop_reason"] = choice.get("stop_reason")
                yield dict(base, choices=[out])
