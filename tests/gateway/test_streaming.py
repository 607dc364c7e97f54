"""Real streaming pass-through: a streamed call streams from the upstream too, chunk by chunk, with
the official SDKs parsing the provider frames as they arrive; its capture record equals the record
of the same request made without streaming. Also: the synthetic fallback for upstreams that cannot
stream token ids, errors after the stream started (in-band upstream error, upstream killed), a
client that goes away mid-stream, and early errors that keep their HTTP status."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Any

import anthropic
import openai
import pytest
import requests
from google import genai
from google.genai import errors as genai_errors
from google.genai import types
from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

from tests.support.servers import GatewayHandle, spawn, start_gateway, start_model_server, stop
from polar_mq.cli.embedded_redis import free_port
from polar_mq.proxy_app.adapters.base import GatewayError
from polar_mq.proxy_app.upstream.pool import StreamAccumulator

PROVIDERS = ["openai_chat", "anthropic", "openai_responses", "gemini"]
TOKEN_MS = 15  # per sampled token in the stand-in: a 60-token answer takes ~1 s upstream
SAY = "polar:say=" + "Streaming words arrive token by token: tabs\tand  spaces, ünïcödé 🚀. " * 3
TOOL_PROMPT = "write the notes polar:think polar:path=" + "deep/" * 6 + "notes.txt"
SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
          "required": ["path", "content"]}


# ----------------------------------------------------------------------------------------------
# Fixtures: a slow stand-in (per-token delay), gateways on it, and a stub upstream in between
# ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def slow_upstream(log_dir) -> str:
    server = start_model_server(log_dir, "--max-model-len", "65536", "--token-latency-ms", str(TOKEN_MS),
                                name="ms-slow")
    yield server.url
    stop(server.proc)


def _gateway(log_dir, redis_url, upstream: str, name: str, **env: str) -> GatewayHandle:
    server = start_gateway(log_dir, redis_url, [upstream], name=name, env=env or None)
    return GatewayHandle(url=server.url, upstream_url=upstream, redis_url=redis_url, server=server)


@pytest.fixture(scope="module")
def slow_gateway(log_dir, redis_url, slow_upstream) -> GatewayHandle:
    gw = _gateway(log_dir, redis_url, slow_upstream, "gw-stream")
    yield gw
    stop(gw.server.proc)


class StubUpstream:
    """A vLLM look-alike in front of the stand-in: it can strip the token ids from streamed answers
    (like vLLM with some tool/reasoning parsers) or fail in-band after a few chunks of a stream whose
    last user message says `stub:break` (vLLM sends `data: {"error": ...}` then `[DONE]`)."""

    def __init__(self, target: str, *, strip_stream_ids: bool = False, break_after: int | None = None):
        self.target = target
        self.strip = strip_stream_ids
        self.break_after = break_after
        self.server = make_server("127.0.0.1", 0, self.app, threaded=True)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()

    def app(self, environ, start_response):
        req = Request(environ)
        url = self.target + req.full_path.rstrip("?")
        if req.method != "POST":
            r = requests.get(url, timeout=10)
            return Response(r.content, r.status_code, content_type=r.headers.get("content-type"))(environ, start_response)
        body = json.loads(req.get_data() or b"{}")
        if not body.get("stream"):
            r = requests.post(url, json=body, timeout=60)
            return Response(r.content, r.status_code, content_type="application/json")(environ, start_response)
        r = requests.post(url, json=body, stream=True, timeout=60)
        if r.status_code != 200:
            return Response(r.content, r.status_code, content_type="application/json")(environ, start_response)
        last = json.dumps((body.get("messages") or [{}])[-1])
        limit = self.break_after if "stub:break" in last else None

        def frames():
            n = 0
            for line in r.iter_lines():
                if not line.startswith(b"data: "):
                    continue
                if line == b"data: [DONE]":
                    yield b"data: [DONE]\n\n"
                    return
                chunk = json.loads(line[6:])
                if self.strip:
                    chunk.pop("prompt_token_ids", None)
                    for choice in chunk.get("choices") or []:
                        choice.pop("token_ids", None)
                yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
                n += 1
                if limit is not None and n >= limit:
                    error = {"error": {"message": "stub: the engine died", "type": "InternalServerError",
                                       "param": None, "code": 500}}
                    yield b"data: " + json.dumps(error).encode() + b"\n\n"
                    yield b"data: [DONE]\n\n"
                    r.close()
                    return

        return Response(frames(), content_type="text/event-stream")(environ, start_response)


@pytest.fixture(scope="module")
def breaking_gateway(log_dir, redis_url, slow_upstream) -> GatewayHandle:
    stub = StubUpstream(slow_upstream, break_after=8)
    gw = _gateway(log_dir, redis_url, stub.url, "gw-stub-break")
    yield gw
    stop(gw.server.proc)
    stub.close()


@pytest.fixture(scope="module")
def stripping_gateway(log_dir, redis_url, slow_upstream) -> GatewayHandle:
    stub = StubUpstream(slow_upstream, strip_stream_ids=True)
    gw = _gateway(log_dir, redis_url, stub.url, "gw-stub-strip")
    yield gw
    stop(gw.server.proc)
    stub.close()


# ----------------------------------------------------------------------------------------------
# One driver per provider, with its official SDK: a call, streamed or not
# ----------------------------------------------------------------------------------------------

class Got:
    def __init__(self) -> None:
        self.first: float | None = None  # wall time of the first content / thought / arguments piece
        self.text = ""
        self.reasoning = ""
        self.calls: list[tuple[str, dict]] = []
        self.events = 0

    def seen(self) -> None:
        self.events += 1
        if self.first is None:
            self.first = time.time()


def _openai(s: dict) -> openai.OpenAI:
    return openai.OpenAI(base_url=s["base_urls"]["openai"], api_key=s["key"], max_retries=0)


def call_openai_chat(s: dict, prompt: str, tools: bool, stream: bool) -> Got:
    got = Got()
    kw: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": prompt}]}
    if tools:
        kw["tools"] = [{"type": "function", "function": {"name": "write", "description": "Write a file",
                                                          "parameters": SCHEMA}}]
    if not stream:
        msg = _openai(s).chat.completions.create(**kw).choices[0].message
        got.text = msg.content or ""
        got.calls = [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls or []]
        return got
    calls: dict[int, dict] = {}
    for ch in _openai(s).chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        reasoning = (d.model_extra or {}).get("reasoning_content")
        if d.content or d.tool_calls or reasoning:
            got.seen()
        got.text += d.content or ""
        got.reasoning += reasoning or ""
        for tc in d.tool_calls or []:
            entry = calls.setdefault(tc.index, {"name": tc.function.name, "args": ""})
            entry["args"] += tc.function.arguments or ""
    got.calls = [(c["name"], json.loads(c["args"])) for _, c in sorted(calls.items())]
    return got


def call_anthropic(s: dict, prompt: str, tools: bool, stream: bool) -> Got:
    got = Got()
    c = anthropic.Anthropic(base_url=s["base_urls"]["anthropic"], api_key=s["key"], max_retries=0)
    kw: dict[str, Any] = {"model": "m", "max_tokens": 2000, "messages": [{"role": "user", "content": prompt}]}
    if tools:
        kw["tools"] = [{"name": "write", "description": "Write a file", "input_schema": SCHEMA}]
    if stream:
        with c.messages.stream(**kw) as st:
            for ev in st:
                if ev.type == "content_block_delta":
                    got.seen()
            msg = st.get_final_message()
    else:
        msg = c.messages.create(**kw)
    for block in msg.content:
        if block.type == "text":
            got.text += block.text
        elif block.type == "thinking":
            got.reasoning += block.thinking
        elif block.type == "tool_use":
            got.calls.append((block.name, block.input))
    return got


def call_openai_responses(s: dict, prompt: str, tools: bool, stream: bool) -> Got:
    got = Got()
    kw: dict[str, Any] = {"model": "m", "input": prompt}
    if tools:
        kw["tools"] = [{"type": "function", "name": "write", "description": "Write a file",
                        "parameters": SCHEMA}]
    if stream:
        final = None
        for ev in _openai(s).responses.create(stream=True, **kw):
            if ev.type.endswith(".delta"):
                got.seen()
            if ev.type == "response.completed":
                final = ev.response
        assert final is not None
    else:
        final = _openai(s).responses.create(**kw)
    for item in final.output:
        if item.type == "message":
            got.text += "".join(p.text for p in item.content if p.type == "output_text")
        elif item.type == "reasoning":
            got.reasoning += "".join(p.text for p in item.summary)
        elif item.type == "function_call":
            got.calls.append((item.name, json.loads(item.arguments)))
    return got


def call_gemini(s: dict, prompt: str, tools: bool, stream: bool) -> Got:
    got = Got()
    c = genai.Client(api_key=s["key"], http_options=types.HttpOptions(base_url=s["base_urls"]["gemini"]))
    kw: dict[str, Any] = {"thinking_config": types.ThinkingConfig(include_thoughts=True)}
    if tools:
        kw["tools"] = [types.Tool(function_declarations=[types.FunctionDeclaration(
            name="write", description="Write a file", parameters_json_schema=SCHEMA)])]
        kw["automatic_function_calling"] = types.AutomaticFunctionCallingConfig(disable=True)
    config = types.GenerateContentConfig(**kw)
    if stream:
        chunks = list(_timed(c.models.generate_content_stream(model="m", contents=prompt, config=config), got))
    else:
        chunks = [c.models.generate_content(model="m", contents=prompt, config=config)]
    for ch in chunks:
        for p in ch.candidates[0].content.parts or []:
            if p.function_call:
                got.calls.append((p.function_call.name, dict(p.function_call.args)))
            elif p.thought:
                got.reasoning += p.text or ""
            else:
                got.text += p.text or ""
    return got


def _timed(chunks, got: Got):
    for ch in chunks:
        if any(p.text or p.function_call for p in ch.candidates[0].content.parts or []):
            got.seen()
        yield ch


CALL = {"openai_chat": call_openai_chat, "anthropic": call_anthropic,
        "openai_responses": call_openai_responses, "gemini": call_gemini}
SAME = ("prompt_token_ids", "completion_token_ids", "completion_logprobs", "finish_reason")


def _without_call_ids(message: dict) -> dict:
    """The stand-in draws fresh tool-call ids per request; everything else must match."""
    out = dict(message)
    if out.get("tool_calls"):
        out["tool_calls"] = [{k: v for k, v in c.items() if k != "id"} for c in out["tool_calls"]]
    return out


def _one(gw: GatewayHandle, session: dict, timeout: float = 10.0) -> dict:
    deadline = time.time() + timeout
    while True:
        calls = gw.calls(session["session_id"])
        if calls or time.time() > deadline:
            assert len(calls) == 1, calls
            return calls[0]
        time.sleep(0.05)


def _assert_same_record(streamed: dict, plain: dict) -> None:
    assert streamed["stream"] is True and plain["stream"] is False
    assert streamed["status"] == plain["status"] == "ok"
    for key in SAME:
        assert streamed[key] == plain[key], key
    assert _without_call_ids(streamed["response_message"]) == _without_call_ids(plain["response_message"])
    assert len(streamed["completion_logprobs"]) == len(streamed["completion_token_ids"]) > 20
    assert not any("synthetic" in n for n in streamed["notes"])


# ----------------------------------------------------------------------------------------------
# Streams arrive incrementally and record exactly what a non-streamed call records
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("kind", ["text", "tool_call"])
def test_stream_is_incremental_and_records_like_non_streaming(slow_gateway, provider, kind):
    tools = kind == "tool_call"
    prompt = TOOL_PROMPT if tools else SAY
    s = slow_gateway.new_session()
    got = CALL[provider](s, prompt, tools, True)
    rec = _one(slow_gateway, s)
    upstream_done = rec["started_at"] + rec["latency_ms"] / 1000
    assert rec["latency_ms"] > 20 * TOKEN_MS
    # the first piece reached the client while the upstream was still sampling (well before the end)
    assert got.first is not None and got.first < rec["started_at"] + 0.5 * (upstream_done - rec["started_at"])
    assert got.events > 5
    message = rec["response_message"]
    if tools:
        assert rec["finish_reason"] == "tool_calls"
        assert got.calls == [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                             for c in message["tool_calls"]]
        assert got.calls[0][1]["path"] == "deep/" * 6 + "notes.txt"
        assert got.reasoning == message["reasoning"] and got.reasoning
    else:
        assert got.text == message["content"] == SAY[len("polar:say="):]  # never altered
    s2 = slow_gateway.new_session()
    plain = CALL[provider](s2, prompt, tools, False)
    assert (plain.text, plain.calls) == (got.text, got.calls)
    _assert_same_record(rec, _one(slow_gateway, s2))


def test_gemini_json_array_stream_without_alt_sse(slow_gateway):
    s = slow_gateway.new_session()
    resp = requests.post(f"{s['base_urls']['gemini']}/v1beta/models/m:streamGenerateContent", timeout=30,
                         json={"contents": [{"role": "user", "parts": [{"text": SAY}]}]})
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("application/json")
    frames = json.loads(resp.content)
    assert len(frames) > 10
    text = "".join(p.get("text", "") for f in frames for p in f["candidates"][0]["content"]["parts"])
    assert text == _one(slow_gateway, s)["response_message"]["content"]
    assert frames[-1]["candidates"][0]["finishReason"] == "STOP" and "usageMetadata" in frames[-1]


def test_client_gone_mid_stream_keeps_what_was_sampled(slow_gateway):
    """The client hanging up aborts the upstream generation (tests/pipeline/test_cancel.py); the record
    keeps the sampled prefix: the first ids of the same greedy answer."""
    s = slow_gateway.new_session()
    resp = requests.post(f"{s['base_urls']['openai']}/chat/completions", stream=True, timeout=30,
                         json={"model": "m", "stream": True, "messages": [{"role": "user", "content": SAY}]})
    for line in resp.iter_lines():
        if b'"content":"' in line and b'"content":""' not in line:
            break
    resp.close()  # the client hangs up after the first piece
    rec = _one(slow_gateway, s, timeout=15)
    assert rec["status"] == "error" and "client closed" in rec["error"]
    direct = slow_gateway.upstream_chat({"messages": rec["messages"]})
    full = direct["choices"][0]["token_ids"]
    assert rec["completion_token_ids"] and len(rec["completion_token_ids"]) < len(full)
    assert rec["completion_token_ids"] == full[:len(rec["completion_token_ids"])]


def test_errors_before_the_first_chunk_keep_their_http_status(slow_gateway):
    s = slow_gateway.new_session()
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "x polar:fail=500"}]}
    t0 = time.time()
    resp = requests.post(f"{s['base_urls']['openai']}/chat/completions", json=body, timeout=30)
    assert resp.status_code == 502 and resp.headers["x-should-retry"] == "true"  # after bounded retries
    assert time.time() - t0 < 15
    with pytest.raises(anthropic.BadRequestError):
        call_anthropic(s, "word " * 70000, False, True)  # context overflow: a 400, not a stream
    calls = slow_gateway.calls(s["session_id"])
    assert [c["status"] for c in calls] == ["error", "error"]
    assert "context_length" in calls[1]["error"]


# ----------------------------------------------------------------------------------------------
# Fallback: upstreams that cannot stream token ids get a synthetic stream (and say so)
# ----------------------------------------------------------------------------------------------

def test_synthetic_stream_when_the_upstream_does_not_stream_ids(stripping_gateway):
    health = requests.get(f"{stripping_gateway.url}/health", timeout=5).json()
    assert health["upstreams"][0]["token_ids"] is True
    assert health["upstreams"][0]["stream_token_ids"] is False
    s = stripping_gateway.new_session()
    got = call_anthropic(s, TOOL_PROMPT, True, True)
    rec = _one(stripping_gateway, s)
    assert any("synthetic stream" in n for n in rec["notes"])
    assert got.calls and got.calls[0][0] == "write"
    # the ids come from a non-streaming call: trainable, and the same as a plain call's
    s2 = stripping_gateway.new_session()
    call_anthropic(s2, TOOL_PROMPT, True, False)
    plain = _one(stripping_gateway, s2)
    for key in SAME:
        assert rec[key] == plain[key], key
    assert len(rec["completion_token_ids"]) > 20


def test_synthetic_stream_when_the_upstream_returns_no_ids(log_dir, redis_url):
    ms = start_model_server(log_dir, "--no-token-ids", name="ms-noids-stream")
    gw = _gateway(log_dir, redis_url, ms.url, "gw-noids-stream")
    try:
        s = gw.new_session()
        got = call_openai_chat(s, SAY, False, True)
        rec = _one(gw, s)
        assert got.text == rec["response_message"]["content"] == SAY[len("polar:say="):]
        assert any("synthetic stream" in n for n in rec["notes"])
        assert "upstream returned no token ids" in rec["notes"]
    finally:
        stop(gw.server.proc)
        stop(ms.proc)


# ----------------------------------------------------------------------------------------------
# Errors after the stream started: the provider's stream error, the record keeps what was sampled
# ----------------------------------------------------------------------------------------------

def _expect_stream_error(provider: str, s: dict, prompt: str) -> Exception:
    errors = {"openai_chat": openai.APIError, "openai_responses": openai.APIError,
              "anthropic": anthropic.APIStatusError, "gemini": genai_errors.APIError}
    with pytest.raises(errors[provider]) as info:
        CALL[provider](s, prompt, False, True)
    return info.value


@pytest.mark.parametrize("provider", PROVIDERS)
def test_upstream_error_mid_stream_is_a_stream_error_and_keeps_partial_ids(breaking_gateway, provider):
    s = breaking_gateway.new_session()
    prompt = SAY + " stub:break"
    err = _expect_stream_error(provider, s, prompt)
    assert "engine died" in str(err)
    rec = _one(breaking_gateway, s)
    assert rec["status"] == "error" and "mid-stream" in rec["error"] and rec["stream"] is True
    assert any("stream broke" in n for n in rec["notes"])
    partial = rec["completion_token_ids"]
    assert 0 < len(partial) < 10 and len(rec["completion_logprobs"]) == len(partial)
    assert rec["prompt_token_ids"] and rec["response_message"]["content"]
    # what was sampled is exactly the head of the full answer
    direct = breaking_gateway.upstream_chat({"messages": rec["messages"]})
    assert direct["choices"][0]["token_ids"][: len(partial)] == partial
    assert direct["prompt_token_ids"] == rec["prompt_token_ids"]


@pytest.mark.parametrize("provider", ["openai_chat", "anthropic"])
def test_upstream_killed_mid_stream(log_dir, redis_url, provider):
    port = free_port()
    ms = spawn([sys.executable, "-m", "polar_mq.dev.model_server", "--host", "127.0.0.1", "--port", str(port),
                "--token-latency-ms", "40"], f"http://127.0.0.1:{port}/health", log_dir, f"ms-kill-{port}")
    gw = _gateway(log_dir, redis_url, ms.url, f"gw-kill-{provider}")
    try:
        s = gw.new_session()
        killer = threading.Timer(1.0, lambda: os.kill(ms.proc.pid, signal.SIGKILL))
        killer.start()
        t0 = time.time()
        _expect_stream_error(provider, s, "talk polar:long")
        assert time.time() - t0 < 20
        rec = _one(gw, s)
        assert rec["status"] == "error" and rec["stream"] is True
        partial = rec["completion_token_ids"]
        assert 5 < len(partial) and len(rec["completion_logprobs"]) == len(partial)
        assert rec["response_message"]["content"].startswith("Line 1: the stand-in model keeps talking")
    finally:
        stop(gw.server.proc)
        stop(ms.proc)


# ----------------------------------------------------------------------------------------------
# The accumulator, on its own
# ----------------------------------------------------------------------------------------------

def test_accumulator_builds_the_result_and_raises_on_an_error_chunk():
    acc = StreamAccumulator()
    chunks = [
        {"id": "c1", "model": "x", "created": 5, "prompt_token_ids": [1, 2, 3],
         "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        {"id": "c1", "choices": [{"index": 0, "delta": {"reasoning": "hm"}, "token_ids": [7],
                                  "logprobs": {"content": [{"logprob": -0.5}]}}]},
        {"id": "c1", "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "t1", "type": "function", "function": {"name": "f"}}]}, "token_ids": [8],
            "logprobs": {"content": [{"logprob": -0.25}]}}]},
        {"id": "c1", "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": "{\"a\": 1}"}}]}, "token_ids": [9, 10],
            "logprobs": {"content": [{"logprob": -1.0}, {"logprob": -2.0}]},
            "finish_reason": "tool_calls"}]},
        {"id": "c1", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}},
    ]
    kinds = [e.kind for c in chunks for e in acc.feed(c)]
    assert kinds == ["start", "reasoning", "tool_start", "tool_args"]
    res = acc.result()
    assert res.message == {"role": "assistant", "content": None, "reasoning": "hm", "tool_calls": [
        {"id": "t1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]}
    assert (res.prompt_token_ids, res.completion_token_ids) == ([1, 2, 3], [7, 8, 9, 10])
    assert res.logprobs == [-0.5, -0.25, -1.0, -2.0] and res.finish_reason == "tool_calls"
    assert res.notes == []
    with pytest.raises(GatewayError, match="engine died"):
        acc.feed({"error": {"message": "engine died", "code": 500}})
    short = StreamAccumulator()
    for chunk in (chunks[0], chunks[1], chunks[4]):
        short.feed(chunk)
    assert short.result().notes  # usage says 4 tokens, 1 id came: said in the record
