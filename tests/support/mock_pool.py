"""A stand-in for the gateway's upstream pool, for in-process gateway tests without a model server.

Like httpx's MockTransport: the test gives one function, `answer(body) -> dict`, that sees the
exact body the gateway sends to vLLM's /v1/chat/completions and returns vLLM's JSON answer (or
raises a GatewayError, as the real pool does for an unreachable or failing upstream). Everything
above the pool is the real gateway: `create_app(settings, store=GatewayStore(real Redis),
pool=MockPool(answer), startup_checks=False)`, driven through Flask's test client. With
`streams=True` the answer is also served as a vLLM stream (one chunk with the prompt ids, one per
completion token, the finish, the usage), so pass-through streaming is covered too.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from polar_mq.proxy_app.upstream.pool import Upstream
from polar_mq.proxy_app.upstream.vllm_wire import parse_chat_response

ROOT = "mock://vllm"


def vllm_answer(body: dict[str, Any], text: str, *, prompt_ids: list[int], completion_ids: list[int],
                finish_reason: str = "stop") -> dict[str, Any]:
    """A vLLM chat completion answer with token ids and logprobs, as `return_token_ids` asks."""
    logprobs = [{"token": f"t{t}", "logprob": -0.5 - i / 10, "bytes": None, "top_logprobs": []}
                for i, t in enumerate(completion_ids)]
    return {"id": "chatcmpl-mock", "object": "chat.completion", "created": 1700000000, "model": body["model"],
            "prompt_token_ids": prompt_ids,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": finish_reason, "stop_reason": None, "token_ids": completion_ids,
                         "logprobs": {"content": logprobs}}],
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(completion_ids),
                      "total_tokens": len(prompt_ids) + len(completion_ids)}}


class MockStream:
    """An open upstream stream (the interface of upstream.UpstreamStream the gateway reads)."""

    def __init__(self, chunks: list[dict[str, Any]]):
        self.url = ROOT
        self._chunks = chunks
        self.closed = False

    def chunks(self) -> Iterator[dict[str, Any]]:
        yield from self._chunks

    def ready(self) -> bool:  # whether the next chunk needs no wait: each is its own read here
        return False

    sees_socket = False  # ready() does not know whether the next read waits

    def can_idle(self) -> bool:  # the client's writer may read it (it never goes quiet)
        return True

    def idle_every(self, seconds: float) -> None:
        self.idle = seconds

    def close(self) -> None:
        self.closed = True

    def release(self) -> None:  # done with a stream read to its end
        self.closed = True


def as_chunks(data: dict[str, Any]) -> list[dict[str, Any]]:
    """A plain vLLM answer (text only) as the chunks vLLM streams for it."""
    choice = data["choices"][0]
    head = {"id": data["id"], "object": "chat.completion.chunk", "created": data["created"], "model": data["model"]}
    text, ids, lps = choice["message"]["content"] or "", choice["token_ids"], choice["logprobs"]["content"]
    step = max(1, -(-len(text) // max(1, len(ids))))
    chunks = [{**head, "prompt_token_ids": data["prompt_token_ids"],
               "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
    for i, (tid, lp) in enumerate(zip(ids, lps)):
        last = i == len(ids) - 1
        piece = text[i * step:] if last else text[i * step:(i + 1) * step]
        chunks.append({**head, "choices": [{"index": 0, "delta": {"content": piece}, "token_ids": [tid],
                                            "logprobs": {"content": [lp]},
                                            "finish_reason": choice["finish_reason"] if last else None}]})
    chunks.append({**head, "choices": [], "usage": data["usage"]})
    return chunks


class MockPool:
    """The upstream pool's interface over one `answer` function; `requests` keeps what was sent."""

    def __init__(self, answer: Callable[[dict[str, Any]], dict[str, Any]], *, model: str = "mock-model",
                 max_model_len: int = 4096, streams: bool = False):
        self.answer = answer
        self.streams = streams
        self.requests: list[dict[str, Any]] = []
        self.upstreams = [Upstream(ROOT, token_ids=True, stream_token_ids=streams, models=[model],
                                   max_model_len=max_model_len)]
        self.on_retry: Callable[..., None] | None = None

    # what the gateway calls
    def ranked(self, affinity_key: str) -> list[Upstream]:
        return list(self.upstreams)

    def chat(self, body: dict[str, Any], affinity_key: str, *, request_id: str | None = None,
             on_attempt: Callable[[str], None] | None = None) -> tuple[Any, str]:
        if on_attempt is not None:
            on_attempt(ROOT)
        self.requests.append(body)
        return parse_chat_response(self.answer(body)), ROOT

    def post_json(self, path: str, body: dict[str, Any], affinity_key: str, parse: Callable[[dict[str, Any]], Any],
                  **kwargs: Any) -> tuple[Any, str]:
        self.requests.append(body)
        return parse(self.answer(body)), ROOT

    def can_abort(self, affinity_key: str) -> bool:
        return False  # no request runs on here long enough to be aborted by id

    def can_stream(self, affinity_key: str) -> bool:
        return self.streams

    def open_stream(self, body: dict[str, Any], affinity_key: str, path: str = "") -> MockStream:
        self.requests.append(body)
        return MockStream(as_chunks(self.answer(body)))

    def mark_no_stream_ids(self, url: str) -> None:
        self.upstreams[0].stream_token_ids = False

    def tokenize(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, model: str,
                 affinity_key: str) -> int | None:
        return None  # no /tokenize here: the gateway falls back to its own estimate

    def served_model(self) -> str | None:
        return self.upstreams[0].models[0]

    def max_model_len(self) -> int | None:
        return self.upstreams[0].max_model_len

    def describe(self) -> list[dict[str, Any]]:
        return [u.describe() for u in self.upstreams]

    # start-up and shutdown (create_app(startup_checks=True), serve.py)
    def check_all(self, model: str | None = None) -> list[Upstream]:
        return list(self.upstreams)

    def start_health_thread(self, model: str | None = None) -> None:
        pass

    def close(self) -> None:
        pass
