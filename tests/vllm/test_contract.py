"""The stand-in model server vs real vLLM 0.32: the same requests give answers with the same fields,
types and chunk structure (values differ: different "models")."""

from __future__ import annotations

import copy

import pytest
import requests

from tests.vllm.shapes import chunk_kind, collapse, diff, sse_events

SERVED = "tiny"
WRITE_TOOL = {
    "type": "function",
    "function": {
        "name": "write",
        "description": "Write content to a file.",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "File path"},
                "content": {"type": "string", "description": "File content"},
            },
            "required": ["path", "content"],
        },
    },
}
ASK = [{"role": "user", "content": "Write hello from polar to polar.txt."}]
HELLO = [{"role": "user", "content": "Say hello."}]
AFTER_TOOL = ASK + [
    {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_0", "type": "function",
        "function": {"name": "write", "arguments": '{"path": "polar.txt", "content": "hello from polar"}'}}]},
    {"role": "tool", "tool_call_id": "call_0", "content": "Wrote 16 bytes to polar.txt"},
]

CHAT_CASES = {
    "plain": {"messages": HELLO, "max_tokens": 24},
    "plain_ids": {"messages": HELLO, "max_tokens": 24, "return_token_ids": True},
    "tools": {"messages": ASK, "tools": [WRITE_TOOL], "max_tokens": 64, "return_token_ids": True},
    "after_tool": {"messages": AFTER_TOOL, "tools": [WRITE_TOOL], "max_tokens": 32, "return_token_ids": True},
    "logprobs": {"messages": HELLO, "max_tokens": 24, "logprobs": True, "top_logprobs": 2,
                 "return_token_ids": True},
    "tools_logprobs": {"messages": ASK, "tools": [WRITE_TOOL], "max_tokens": 64, "logprobs": True,
                       "top_logprobs": 0, "return_token_ids": True},
    "length": {"messages": HELLO, "max_tokens": 3, "return_token_ids": True},
}

STREAM_CASES = {
    "stream_plain": {"messages": HELLO, "max_tokens": 24},
    "stream_ids_usage": {"messages": HELLO, "max_tokens": 24, "return_token_ids": True,
                         "stream_options": {"include_usage": True}},
    "stream_tools": {"messages": ASK, "tools": [WRITE_TOOL], "max_tokens": 64, "return_token_ids": True,
                     "stream_options": {"include_usage": True}},
    "stream_tools_logprobs": {"messages": ASK, "tools": [WRITE_TOOL], "max_tokens": 64, "logprobs": True,
                              "top_logprobs": 1, "return_token_ids": True},
    "stream_after_tool": {"messages": AFTER_TOOL, "tools": [WRITE_TOOL], "max_tokens": 32,
                          "return_token_ids": True, "stream_options": {"include_usage": True}},
}


def post(url: str, path: str, body: dict, stream: bool = False) -> requests.Response:
    return requests.post(f"{url}{path}", json=body, timeout=120, stream=stream)


def both(vllm_url: str, standin_url: str, path: str, body: dict, stream: bool = False):
    a = post(vllm_url, path, copy.deepcopy(body), stream)
    b = post(standin_url, path, copy.deepcopy(body), stream)
    return a, b


def assert_same_shape(a, b, what: str) -> None:
    problems = diff(a, b)
    assert not problems, f"{what}: stand-in differs from vLLM:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("case", sorted(CHAT_CASES))
def test_chat_same_shape(case, vllm_url, standin_url):
    body = {"model": SERVED, "temperature": 0, **CHAT_CASES[case]}
    a, b = both(vllm_url, standin_url, "/v1/chat/completions", body)
    assert a.status_code == b.status_code == 200, (a.text, b.text)
    va, vb = a.json(), b.json()
    assert_same_shape(va, vb, case)
    if case in ("tools", "tools_logprobs"):
        # the overfit tiny model and the stand-in both call the write tool here
        for v in (va, vb):
            assert v["choices"][0]["finish_reason"] == "tool_calls", v
            assert v["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "write"


@pytest.mark.parametrize("case", sorted(STREAM_CASES))
def test_stream_same_chunk_structure(case, vllm_url, standin_url):
    body = {"model": SERVED, "temperature": 0, "stream": True, **STREAM_CASES[case]}
    a, b = both(vllm_url, standin_url, "/v1/chat/completions", body, stream=True)
    assert a.status_code == b.status_code == 200, (a.text, b.text)
    assert a.headers["content-type"].split(";")[0] == b.headers["content-type"].split(";")[0]
    ca, cb = sse_events(a), sse_events(b)
    ka, kb = collapse([chunk_kind(c) for c in ca]), collapse([chunk_kind(c) for c in cb])
    assert ka == kb, f"chunk sequence: vllm {ka} vs stand-in {kb}"
    # chunk by chunk, per kind: the first chunk of each kind, and the set of shapes per kind
    by_a: dict[str, list] = {}
    by_b: dict[str, list] = {}
    for c in ca:
        by_a.setdefault(chunk_kind(c), []).append(c)
    for c in cb:
        by_b.setdefault(chunk_kind(c), []).append(c)
    for kind in by_a:
        if kind == "DONE":
            continue
        assert_same_shape(by_a[kind][0], by_b[kind][0], f"{case} first '{kind}' chunk")
        assert_same_shape(by_a[kind][-1], by_b[kind][-1], f"{case} last '{kind}' chunk")
    if body.get("return_token_ids"):
        # ids: every chunk's token_ids together = all sampled ids; usage agrees
        for chunks in (ca, cb):
            ids = [t for c in chunks if c != "[DONE]" for ch in c.get("choices", []) for t in (ch.get("token_ids") or [])]
            assert ids
            usage = [c for c in chunks if c != "[DONE]" and c.get("usage")]
            if usage:
                assert usage[-1]["usage"]["completion_tokens"] == len(ids)
                assert usage[-1]["usage"]["prompt_tokens"] == len(chunks[0]["prompt_token_ids"])


def test_stream_ids_equal_nonstream_ids(vllm_url):
    """vLLM itself: streamed token_ids (concatenated) == the non-streamed token_ids (greedy)."""
    body = {"model": SERVED, "temperature": 0, "messages": ASK, "tools": [WRITE_TOOL], "max_tokens": 64,
            "return_token_ids": True}
    full = post(vllm_url, "/v1/chat/completions", body).json()
    chunks = sse_events(post(vllm_url, "/v1/chat/completions", {**body, "stream": True}, stream=True))
    ids = [t for c in chunks if c != "[DONE]" for ch in c["choices"] for t in (ch.get("token_ids") or [])]
    assert ids == full["choices"][0]["token_ids"]
    assert chunks[0]["prompt_token_ids"] == full["prompt_token_ids"]


def test_same_token_ids_for_same_prompt(vllm_url, standin_url):
    """Shared tokenizer + template: the prompt ids are identical on both servers."""
    for messages, tools in ((HELLO, None), (ASK, [WRITE_TOOL]), (AFTER_TOOL, [WRITE_TOOL])):
        body = {"model": SERVED, "messages": messages, "max_tokens": 1, "return_token_ids": True}
        if tools:
            body["tools"] = tools
        a, b = both(vllm_url, standin_url, "/v1/chat/completions", body)
        assert a.json()["prompt_token_ids"] == b.json()["prompt_token_ids"]


def test_overfit_model_answers_like_the_stand_in(vllm_url, standin_url):
    """The overfit tiny model's tool call is the stand-in's default one for this request."""
    body = {"model": SERVED, "messages": ASK, "tools": [WRITE_TOOL], "max_tokens": 64, "return_token_ids": True}
    a, b = both(vllm_url, standin_url, "/v1/chat/completions", body)
    ma, mb = a.json()["choices"][0]["message"], b.json()["choices"][0]["message"]
    fa, fb = ma["tool_calls"][0]["function"], mb["tool_calls"][0]["function"]
    assert (fa["name"], fa["arguments"]) == (fb["name"], fb["arguments"])
    assert a.json()["choices"][0]["token_ids"] == b.json()["choices"][0]["token_ids"]


@pytest.mark.parametrize("case", ["prompt", "messages", "messages_tools"])
def test_tokenize_same_shape(case, vllm_url, standin_url):
    body = {"model": SERVED}
    if case == "prompt":
        body["prompt"] = "hello from polar"
    else:
        body.update(messages=ASK, add_generation_prompt=True)
        if case == "messages_tools":
            body["tools"] = [WRITE_TOOL]
    a, b = both(vllm_url, standin_url, "/tokenize", body)
    assert a.status_code == b.status_code == 200, (a.text, b.text)
    assert_same_shape(a.json(), b.json(), f"tokenize {case}")
    assert a.json()["tokens"] == b.json()["tokens"]


def test_detokenize_same(vllm_url, standin_url):
    ids = post(vllm_url, "/tokenize", {"model": SERVED, "messages": AFTER_TOOL, "tools": [WRITE_TOOL]}).json()["tokens"]
    a, b = both(vllm_url, standin_url, "/detokenize", {"model": SERVED, "tokens": ids})
    assert a.status_code == b.status_code == 200
    assert_same_shape(a.json(), b.json(), "detokenize")
    assert a.json()["prompt"] == b.json()["prompt"]


@pytest.mark.parametrize("stream", [False, True])
def test_completions_token_prompt_same_shape(stream, vllm_url, standin_url):
    ids = post(vllm_url, "/tokenize", {"model": SERVED, "messages": HELLO, "add_generation_prompt": True}).json()["tokens"]
    body = {"model": SERVED, "prompt": ids, "max_tokens": 8, "temperature": 0, "return_token_ids": True}
    if stream:
        body["stream"] = True
        a, b = both(vllm_url, standin_url, "/v1/completions", body, stream=True)
        ca, cb = sse_events(a), sse_events(b)
        assert ca[-1] == cb[-1] == "[DONE]"
        assert_same_shape(ca[0], cb[0], "completions first chunk")
        assert_same_shape(ca[-2], cb[-2], "completions last chunk")
    else:
        a, b = both(vllm_url, standin_url, "/v1/completions", body)
        assert a.status_code == b.status_code == 200, (a.text, b.text)
        assert_same_shape(a.json(), b.json(), "completions")
        assert a.json()["choices"][0]["prompt_token_ids"] == ids


def test_models_same_shape(vllm_url, standin_url):
    a, b = requests.get(f"{vllm_url}/v1/models", timeout=10), requests.get(f"{standin_url}/v1/models", timeout=10)
    assert_same_shape(a.json(), b.json(), "models")


@pytest.mark.parametrize("case", ["unknown_model", "too_long", "bad_max_tokens"])
def test_errors_same_shape(case, vllm_url, standin_url):
    body = {"model": SERVED, "messages": HELLO, "max_tokens": 8}
    if case == "unknown_model":
        body["model"] = "no-such-model"
    elif case == "too_long":
        # more tokens than either server's --max-model-len (vllm_cpu.MAX_MODEL_LEN)
        body["messages"] = [{"role": "user", "content": "hello " * 12000}]
    else:
        body["max_tokens"] = 0
    a, b = both(vllm_url, standin_url, "/v1/chat/completions", body)
    assert a.status_code == b.status_code, (a.status_code, a.text, b.status_code, b.text)
    assert_same_shape(a.json(), b.json(), f"error {case}")


def _token_in_body(vllm_url: str, messages: list, stream: bool) -> dict:
    """The token-in continuation request exactly as the gateway's route sends it."""
    from polar_mq.proxy_app.tito.route import completions_body

    ids = post(vllm_url, "/tokenize", {"model": SERVED, "messages": messages, "tools": [WRITE_TOOL],
                                       "add_generation_prompt": True}).json()["tokens"]
    chat = {"model": SERVED, "temperature": 0, "max_tokens": 64, "logprobs": True, "return_token_ids": True}
    return completions_body(chat, ids, None, stream)


def _anonymous_tops(obj):
    """Completions `top_logprobs` are dicts keyed by token text: keep their shape, not the tokens
    (the two servers' answers after a tool result differ: other "models")."""
    for choice in obj.get("choices") or [] if isinstance(obj, dict) else []:
        lp = choice.get("logprobs") or {}
        if isinstance(lp.get("top_logprobs"), list):
            lp["top_logprobs"] = [[type(v).__name__ for v in d.values()] if isinstance(d, dict) else d
                                  for d in lp["top_logprobs"]]
    return obj


@pytest.mark.parametrize("messages", [ASK, AFTER_TOOL], ids=["ask", "after_tool"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_token_in_continuation_request_same(stream, messages, vllm_url, standin_url):
    """What the gateway's token-in route sends (a rendered conversation as ids, logprobs 0,
    special tokens kept): same shape, and for the first turn the overfit model and the stand-in
    sample the same ids (the stand-in answers a rendered conversation as its chat endpoint would)."""
    body = _token_in_body(vllm_url, messages, stream)
    if stream:
        a, b = both(vllm_url, standin_url, "/v1/completions", body, stream=True)
        ca, cb = sse_events(a), sse_events(b)
        assert ca[-1] == cb[-1] == "[DONE]"
        for i, what in ((0, "first chunk"), (-2, "usage chunk"), (-3, "last token chunk")):
            assert_same_shape(_anonymous_tops(ca[i]), _anonymous_tops(cb[i]), f"token-in {what}")
        ids_a = [t for c in ca[:-1] for ch in c["choices"] for t in ch.get("token_ids") or []]
        ids_b = [t for c in cb[:-1] for ch in c["choices"] for t in ch.get("token_ids") or []]
        text_a = "".join(ch["text"] for c in ca[:-1] for ch in c["choices"])
        text_b = "".join(ch["text"] for c in cb[:-1] for ch in c["choices"])
    else:
        a, b = both(vllm_url, standin_url, "/v1/completions", body)
        assert a.status_code == b.status_code == 200, (a.text, b.text)
        assert_same_shape(_anonymous_tops(a.json()), _anonymous_tops(b.json()), "token-in completion")
        ids_a, ids_b = a.json()["choices"][0]["token_ids"], b.json()["choices"][0]["token_ids"]
        text_a, text_b = a.json()["choices"][0]["text"], b.json()["choices"][0]["text"]
    assert ("<tool_call>" in text_a) == ("<tool_call>" in text_b) == (messages is ASK)
    if messages is ASK:  # the overfit model was trained to answer this as the stand-in does
        assert ids_a == ids_b and text_a == text_b


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_first_chunk_prompt_ids_take_the_text_path(path, vllm_url, standin_url):
    """The gateway keeps a first chunk's prompt ids as text (token_ids.py) only when they are written
    compactly, as vLLM writes them: both servers' raw first chunks must take that path (else the
    stand-in would benchmark a gateway that parses 29k ints real vLLM never makes it parse)."""
    from polar_mq.proxy_app import fastjson
    from polar_mq.proxy_app.upstream.vllm_wire import _prompt_ids, load_answer
    from polar_mq._io.token_ids import TokenIds

    if path == "/v1/chat/completions":
        extra = {"messages": ASK}
    else:  # token-in: a prompt of ids
        extra = {"prompt": post(vllm_url, "/tokenize", {"model": SERVED, "messages": HELLO,
                                                        "add_generation_prompt": True}).json()["tokens"]}
    body = {"model": SERVED, "temperature": 0, "max_tokens": 4, "stream": True, "return_token_ids": True, **extra}
    for url in (vllm_url, standin_url):
        resp = post(url, path, body, stream=True)
        assert resp.status_code == 200, resp.text
        first = next(line for line in resp.iter_lines() if line.startswith(b"data: {"))[6:]
        resp.close()
        chunk = load_answer(first, fastjson.loads)
        ids = _prompt_ids(chunk)
        assert isinstance(ids, TokenIds), (url, first[:300])
        assert ids == _prompt_ids(fastjson.loads(first)) and len(ids) > 3
