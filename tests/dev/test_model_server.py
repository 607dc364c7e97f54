"""The stand-in model server speaks vLLM's wire format and keeps the prefix property."""

from __future__ import annotations

import json
import os

import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import pytest
import requests

openai = pytest.importorskip("openai")

from polar_mq.dev.model_server.tokenizer import load_tokenizer  # noqa: E402

WRITE_TOOL = {
    "type": "function",
    "function": {
        "name": "Write",
        "description": "Write a file",
        "parameters": {
            "type": "object",
            "properties": {"file_path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["file_path", "content"],
        },
    },
}
BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "Bash",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}, "timeout": {"type": "number"}},
            "required": ["command"],
        },
    },
}


@contextmanager
def run_server(*extra: str):
    """Start ``python -m polar_mq.dev.model_server --port 0`` and yield its base URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "polar_mq.dev.model_server", "--host", "127.0.0.1", "--port", "0", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.time() + 30
        url = None
        while time.time() < deadline:
            line = proc.stdout.readline()
            if not line:
                if proc.poll() is not None:
                    break
                continue
            if "ready on " in line:
                url = line.split("ready on ", 1)[1].split()[0]
                break
        assert url, "model server did not start"
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def server_url_own(request):
    """The session's stand-in server (conftest's ``model_server``), else one started here."""
    try:
        yield request.getfixturevalue("model_server")
        return
    except pytest.FixtureLookupError:
        pass
    with run_server() as url:
        yield url


@pytest.fixture(scope="module")
def max_len(server_url_own):
    return requests.get(server_url_own + "/v1/models", timeout=5).json()["data"][0]["max_model_len"]


@pytest.fixture(scope="module")
def client(server_url_own):
    return openai.OpenAI(base_url=server_url_own + "/v1", api_key="x", max_retries=0)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def _chat(client, messages, **kw):
    extra = kw.pop("extra_body", {})
    extra.setdefault("return_token_ids", True)
    return client.chat.completions.create(model="stand-in", messages=messages, extra_body=extra, **kw)


def _extra(obj, name):
    return (obj.model_extra or {}).get(name)


# ---- tokenizer ------------------------------------------------------------------------------

def test_tokenizer_roundtrip_and_specials(tok, tmp_path):
    s = "héllo 世界 <|im_end|>\n\n  x <tool_call>"
    ids = tok.encode(s)
    assert tok.decode(ids) == s
    assert tok.eos_token_id in ids and tok.encode("<tool_call>") == [tok.special_ids["<tool_call>"]]
    assert tok.token_str(tok.eos_token_id) == "<|im_end|>"
    # a second cache root builds the same files
    other = load_tokenizer(str(tmp_path))
    assert other.encode(s) == ids
    assert os.path.isfile(os.path.join(other.path, "tokenizer_config.json"))
    cfg = json.load(open(os.path.join(other.path, "tokenizer_config.json")))
    assert "chat_template" in cfg and cfg["eos_token"] == "<|im_end|>"


def test_template_parses_string_arguments(tok):
    msgs = [{"role": "user", "content": "hi"}]
    a = {"role": "assistant", "content": None,
         "tool_calls": [{"id": "1", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "ls"}'}}]}
    b = {"role": "assistant", "content": None,
         "tool_calls": [{"id": "1", "type": "function", "function": {"name": "Bash", "arguments": {"command": "ls"}}}]}
    ra, rb = tok.render(msgs + [a]), tok.render(msgs + [b])
    assert ra == rb
    assert '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>' in ra


# ---- HTTP surface ---------------------------------------------------------------------------

def test_health_models_version(server_url_own, max_len):
    r = requests.get(server_url_own + "/health", timeout=5)
    assert r.status_code == 200 and r.content == b""
    m = requests.get(server_url_own + "/v1/models", timeout=5).json()
    assert m["object"] == "list" and m["data"][0]["id"] == "stand-in"
    assert m["data"][0]["max_model_len"] == max_len and m["data"][0]["owned_by"] == "vllm"


def test_chat_text_ids_and_logprobs(client, tok):
    r = _chat(client, [{"role": "user", "content": "hello there"}], logprobs=True, top_logprobs=3)
    ch = r.choices[0]
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion"
    assert ch.message.content == "Hello from the stand-in model. You said: hello there"
    ids = _extra(ch, "token_ids")
    prompt_ids = _extra(r, "prompt_token_ids")
    assert ids[-1] == tok.eos_token_id
    assert tok.decode(ids[:-1]) == ch.message.content
    assert prompt_ids == tok.apply_chat_template([{"role": "user", "content": "hello there"}])
    assert r.usage.prompt_tokens == len(prompt_ids) and r.usage.completion_tokens == len(ids)
    lps = ch.logprobs.content
    assert len(lps) == len(ids)
    assert [e.token for e in lps] == [tok.token_str(i) for i in ids]
    assert all(e.logprob < 0 and len(e.top_logprobs) == 3 for e in lps)
    assert all(e.top_logprobs[0].logprob == e.logprob for e in lps)
    assert ch.finish_reason == "stop"
    # deterministic
    r2 = _chat(client, [{"role": "user", "content": "hello there"}], logprobs=True)
    assert _extra(r2.choices[0], "token_ids") == ids
    assert [e.logprob for e in r2.choices[0].logprobs.content] == [e.logprob for e in lps]


def test_no_return_token_ids_gives_null(client):
    r = client.chat.completions.create(model="stand-in", messages=[{"role": "user", "content": "x"}])
    assert _extra(r.choices[0], "token_ids") is None and _extra(r, "prompt_token_ids") is None


def test_tool_call_and_prefix_property(client, tok):
    tools = [WRITE_TOOL, BASH_TOOL]
    history = [{"role": "system", "content": "You are terse."},
               {"role": "user", "content": "please write the file polar:think"}]
    r1 = _chat(client, history, tools=tools, logprobs=True)
    c1 = r1.choices[0]
    assert c1.finish_reason == "tool_calls"
    tc = c1.message.tool_calls[0]
    assert tc.function.name == "Write" and tc.id.startswith("chatcmpl-tool-")
    assert json.loads(tc.function.arguments) == {"file_path": "polar.txt", "content": "hello from polar"}
    assert c1.message.reasoning
    ids1 = _extra(c1, "token_ids")
    p1 = _extra(r1, "prompt_token_ids")
    assert len(c1.logprobs.content) == len(ids1)
    assert ids1[0] == tok.special_ids["<think>"]

    assistant = {"role": "assistant", "content": c1.message.content, "reasoning": c1.message.reasoning,
                 "tool_calls": [{"id": tc.id, "type": "function",
                                 "function": {"name": tc.function.name, "arguments": tc.function.arguments}}]}
    history2 = history + [assistant, {"role": "tool", "tool_call_id": tc.id, "content": "wrote polar.txt"}]
    r2 = _chat(client, history2, tools=tools)
    p2 = _extra(r2, "prompt_token_ids")
    assert p2[: len(p1) + len(ids1)] == p1 + ids1
    c2 = r2.choices[0]
    assert c2.finish_reason == "stop" and c2.message.content.startswith("Done: the tool returned wrote polar.txt")
    ids2 = _extra(c2, "token_ids")

    history3 = history2 + [{"role": "assistant", "content": c2.message.content, "reasoning": c2.message.reasoning},
                           {"role": "user", "content": "thanks"}]
    r3 = _chat(client, history3, tools=tools)
    p3 = _extra(r3, "prompt_token_ids")
    assert p3[: len(p2) + len(ids2)] == p2 + ids2


def test_parallel_and_shell_tools(client):
    r = _chat(client, [{"role": "user", "content": "go polar:parallel"}], tools=[BASH_TOOL])
    calls = r.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["Bash", "Bash"]
    assert json.loads(calls[0].function.arguments) == {"command": "echo hello from polar > polar.txt"}
    assert json.loads(calls[1].function.arguments) == {"command": "echo hello from polar > polar2.txt"}
    assert calls[0].id != calls[1].id


def test_directives(client):
    r = _chat(client, [{"role": "user", "content": "polar:say=Grüße, 世界 ✓\nmore"}], tools=[WRITE_TOOL])
    assert r.choices[0].message.content == "Grüße, 世界 ✓" and not r.choices[0].message.tool_calls
    r = _chat(client, [{"role": "user", "content": "x polar:notool"}], tools=[WRITE_TOOL])
    assert not r.choices[0].message.tool_calls
    r = _chat(client, [{"role": "user", "content": "x polar:path=out/a.md"}], tools=[WRITE_TOOL])
    assert json.loads(r.choices[0].message.tool_calls[0].function.arguments)["file_path"] == "out/a.md"
    with pytest.raises(openai.InternalServerError):
        _chat(client, [{"role": "user", "content": "polar:fail=500"}])
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"}},
              "required": ["name", "n"]}
    r = _chat(client, [{"role": "user", "content": "json please polar:json"}],
              response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    obj = json.loads(r.choices[0].message.content)
    assert isinstance(obj["name"], str) and isinstance(obj["n"], int)


def test_max_tokens_truncation(client, tok):
    r = _chat(client, [{"role": "user", "content": "talk polar:long"}], max_tokens=50, logprobs=True)
    ch = r.choices[0]
    ids = _extra(ch, "token_ids")
    assert ch.finish_reason == "length" and len(ids) == 50 and len(ch.logprobs.content) == 50
    assert tok.decode(ids) == ch.message.content
    full = _chat(client, [{"role": "user", "content": "talk polar:long"}])
    full_ids = _extra(full.choices[0], "token_ids")
    assert len(full_ids) > 500 and full_ids[:50] == ids


def test_stop_string(client):
    r = _chat(client, [{"role": "user", "content": "hello"}], stop=["stand-in"])
    ch = r.choices[0]
    assert ch.message.content == "Hello from the " and ch.finish_reason == "stop"
    assert _extra(ch, "stop_reason") == "stand-in"


def test_context_length_error(client, server_url_own, max_len):
    with pytest.raises(openai.BadRequestError) as ei:
        _chat(client, [{"role": "user", "content": "hi"}], max_tokens=max_len - 8)
    assert f"maximum context length is {max_len} tokens" in str(ei.value)
    r = requests.post(server_url_own + "/v1/chat/completions", timeout=5,
                      json={"model": "stand-in", "messages": [{"role": "user", "content": "word " * (max_len + 10)}]})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == 400 and err["type"] == "BadRequestError" and "maximum context length" in err["message"]


def test_unknown_model_404(server_url_own):
    r = requests.post(server_url_own + "/v1/chat/completions", timeout=5,
                      json={"model": "nope", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 404
    assert r.json()["error"] == {"message": "The model `nope` does not exist.", "type": "NotFoundError",
                                 "param": "model", "code": 404}


def _stream(client, messages, **kw):
    extra = kw.pop("extra_body", {})
    extra.setdefault("return_token_ids", True)
    return list(client.chat.completions.create(
        model="stand-in", messages=messages, stream=True, stream_options={"include_usage": True},
        extra_body=extra, **kw))


@pytest.mark.parametrize("text,tools", [
    ("hello 世界 polar:think", None),
    ("write it polar:parallel polar:think", [WRITE_TOOL]),
])
def test_streaming_matches_non_streaming(client, text, tools):
    msgs = [{"role": "user", "content": text}]
    kw = {"tools": tools} if tools else {}
    full = _chat(client, msgs, logprobs=True, **kw)
    chunks = _stream(client, msgs, logprobs=True, **kw)
    assert len({c.id for c in chunks}) == 1 and all(c.object == "chat.completion.chunk" for c in chunks)
    first = chunks[0]
    assert first.choices[0].delta.role == "assistant" and first.choices[0].delta.content == ""
    assert _extra(first, "prompt_token_ids") == _extra(full, "prompt_token_ids")
    usage = chunks[-1]
    assert usage.choices == [] and usage.usage.completion_tokens == full.usage.completion_tokens
    body = chunks[1:-1]
    ids, lps, content, reasoning, calls = [], [], "", "", {}
    for c in body:
        ch = c.choices[0]
        ids += _extra(ch, "token_ids") or []
        if ch.logprobs and ch.logprobs.content:
            lps += [e.logprob for e in ch.logprobs.content]
        d = ch.delta
        content += d.content or ""
        reasoning += _extra(d, "reasoning") or ""
        for tcd in d.tool_calls or []:
            slot = calls.setdefault(tcd.index, {"id": None, "name": None, "arguments": ""})
            if tcd.id:
                assert slot["id"] is None
                slot["id"], slot["name"] = tcd.id, tcd.function.name
                # real vLLM 0.32 (hermes parser): the header delta has no `arguments` key
                assert tcd.function.arguments is None
            else:
                slot["arguments"] += tcd.function.arguments
    fc = full.choices[0]
    assert body[-1].choices[0].finish_reason == fc.finish_reason
    assert ids == _extra(fc, "token_ids")
    assert lps == [e.logprob for e in fc.logprobs.content]
    assert content == (fc.message.content or "")
    assert reasoning == (fc.message.reasoning or "")
    assert [(calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)] == [
        (t.function.name, t.function.arguments) for t in fc.message.tool_calls or []]


def test_sleep_directive(client):
    t0 = time.time()
    _chat(client, [{"role": "user", "content": "wait polar:sleep=0.4"}])
    assert time.time() - t0 >= 0.4


def test_raw_sse_ends_with_done(server_url_own):
    r = requests.post(server_url_own + "/v1/chat/completions", timeout=5, stream=True, json={
        "model": "stand-in", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
    lines = [ln for ln in r.iter_lines(decode_unicode=True) if ln]
    assert all(ln.startswith("data: ") for ln in lines) and lines[-1] == "data: [DONE]"


def test_tokenize_detokenize(server_url_own, tok, max_len):
    msgs = [{"role": "user", "content": "hi"}]
    t = requests.post(server_url_own + "/tokenize", timeout=5,
                      json={"model": "stand-in", "messages": msgs, "tools": [WRITE_TOOL],
                            "add_generation_prompt": True}).json()
    assert t["tokens"] == tok.apply_chat_template(msgs, tools=[WRITE_TOOL])
    assert t["count"] == len(t["tokens"]) and t["max_model_len"] == max_len
    d = requests.post(server_url_own + "/detokenize", timeout=5, json={"tokens": t["tokens"]}).json()
    assert d["prompt"] == tok.render(msgs, tools=[WRITE_TOOL])
    p = requests.post(server_url_own + "/tokenize", timeout=5, json={"prompt": "héllo <|im_end|>"}).json()
    assert tok.decode(p["tokens"]) == "héllo <|im_end|>"


def test_completions_with_token_ids(server_url_own, tok):
    prompt_ids = tok.apply_chat_template([{"role": "user", "content": "hey"}])
    r = requests.post(server_url_own + "/v1/completions", timeout=5, json={
        "model": "stand-in", "prompt": prompt_ids, "max_tokens": 100, "return_token_ids": True}).json()
    ch = r["choices"][0]
    assert ch["text"].startswith("Hello from the stand-in model. You said: hey")
    assert ch["prompt_token_ids"] == prompt_ids and ch["token_ids"][-1] == tok.eos_token_id


def test_no_token_ids_flag_and_scripted(tmp_path):
    script = tmp_path / "s.json"
    script.write_text(json.dumps([{"tool": "Bash", "arguments": {"command": "ls"}}, {"text": "all done"}]))
    with run_server("--no-token-ids", "--scripted", str(script), "--served-model-name", "m2") as url:
        c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        msgs = [{"role": "user", "content": "go"}]
        r = c.chat.completions.create(model="m2", messages=msgs, tools=[BASH_TOOL],
                                      extra_body={"return_token_ids": True})
        assert _extra(r.choices[0], "token_ids") is None and _extra(r, "prompt_token_ids") is None
        tc = r.choices[0].message.tool_calls[0]
        assert json.loads(tc.function.arguments) == {"command": "ls"}
        msgs += [{"role": "assistant", "content": None, "tool_calls": [tc.model_dump()]},
                 {"role": "tool", "tool_call_id": tc.id, "content": "a b"}]
        r = c.chat.completions.create(model="m2", messages=msgs, tools=[BASH_TOOL])
        assert r.choices[0].message.content == "all done"


def test_prompt_cache_answers_the_same_ids_and_stays_bounded():
    """--prompt-cache N (bench/bench_gateway.py --upstream-prompt-cache): a repeated prompt skips
    the tokenizer; every answer is the one an uncached server gives, and at most N prompts stay."""
    from polar_mq.dev.model_server.app import ServerConfig
    from polar_mq.dev.model_server.app import create_app

    cached = create_app(ServerConfig(prompt_cache=2))
    plain = create_app(ServerConfig())
    bodies = [{"model": "stand-in", "max_tokens": 8, "return_token_ids": True, "logprobs": True,
               "messages": [{"role": "user", "content": f"prompt {i} polar:notool"}]} for i in range(3)]
    c, p = cached.test_client(), plain.test_client()
    for body in bodies + bodies[::-1] + bodies:
        got = c.post("/v1/chat/completions", json=body).get_json()
        want = p.post("/v1/chat/completions", json=body).get_json()
        assert got["prompt_token_ids"] == want["prompt_token_ids"] and got["prompt_token_ids"]
        assert got["choices"][0]["token_ids"] == want["choices"][0]["token_ids"]
    assert len(cached.config["STAND_IN"]._prompts) == 2
    assert not plain.config["STAND_IN"]._prompts


def test_abort_by_id_cuts_a_plain_generation_short_as_vllm():
    """vLLM dev mode's `POST /abort_requests` (the gateway's abort of a plain call): the request
    is named after X-Request-Id; aborted, the plain answer holds what was sampled so far, ids and
    logprobs aligned, finish_reason "abort"; unknown ids are ignored; bad bodies get a 400
    (tests/vllm/test_rl_vllm.py compares all of it with real vLLM)."""
    from polar_mq.dev.model_server.app import ServerConfig
    from polar_mq.dev.model_server.app import create_app

    app = create_app(ServerConfig(token_latency_ms=20))
    body = {"model": "stand-in", "max_tokens": 400, "return_token_ids": True, "logprobs": True,
            "messages": [{"role": "user", "content": "polar:long tell me a long story"}]}
    whole = app.test_client().post("/v1/chat/completions", json={**body, "max_tokens": 6},
                                   headers={"X-Request-Id": "whole-1"}).get_json()
    assert whole["id"] == "chatcmpl-whole-1" and whole["choices"][0]["finish_reason"] == "length"
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("r", app.test_client().post(
        "/v1/chat/completions", json=body, headers={"X-Request-Id": "polar-abort-1"})))
    t.start()
    c = app.test_client()
    deadline = time.time() + 10
    while c.get("/polar/generations").get_json()["running"] < 1:
        assert time.time() < deadline
        time.sleep(0.01)
    time.sleep(0.15)
    assert c.post("/abort_requests", json={"request_ids": ["chatcmpl-unknown"]}).get_json() == {
        "status": "aborted", "aborted": 1}
    assert c.get("/polar/generations").get_json()["running"] == 1  # an unknown id stops nothing
    r = c.post("/abort_requests", json={"request_ids": ["chatcmpl-polar-abort-1"]})
    assert r.status_code == 200 and r.get_json() == {"status": "aborted", "aborted": 1}
    t.join(10)
    got = out["r"].get_json()
    choice = got["choices"][0]
    assert got["id"] == "chatcmpl-polar-abort-1" and choice["finish_reason"] == "abort"
    n = len(choice["token_ids"])
    assert 2 <= n < 400 and len(choice["logprobs"]["content"]) == n == got["usage"]["completion_tokens"]
    assert choice["message"]["content"] and choice["stop_reason"] is None
    (aborted,) = c.get("/polar/generations").get_json()["aborted"]
    assert aborted["id"] == "chatcmpl-polar-abort-1" and aborted["sent_tokens"] == n
    bad = c.post("/abort_requests", data=b"{no", content_type="application/json")
    assert (bad.status_code, bad.get_json()["error"]["message"]) == (400, "Invalid JSON format")
    bad = c.post("/abort_requests", json=["chatcmpl-x"])
    assert (bad.status_code, bad.get_json()["error"]["message"]) == (400, "Request body must be a JSON object")
    plain = create_app(ServerConfig(dev_mode=False)).test_client()
    assert plain.post("/abort_requests", json={"request_ids": ["x"]}).status_code == 404
    assert plain.post("/pause").status_code == 404


def test_scripted_when_rules():
    """A `when` step answers any request whose latest user text contains its text; the positional
    steps skip it (the lineage recordings script compaction with it: scripts/record_lineage.py)."""
    from polar_mq.dev.model_server.script import decide

    script = [{"when": "summarize", "text": "SUMMARY"}, {"tool": "bash", "arguments": {"command": "ls"}},
              {"text": "done"}]
    tools = [BASH_TOOL]
    r = decide([{"role": "user", "content": "go"}], tools, scripted=script)
    assert [(c.name, c.arguments) for c in r.tool_calls] == [("bash", {"command": "ls"})]
    call = {"role": "assistant", "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]}
    after = [{"role": "user", "content": "go"}, call, {"role": "tool", "tool_call_id": "c1", "content": "x"}]
    assert decide(after, tools, scripted=script).content == "done"
    r = decide(after + [{"role": "assistant", "content": "done"},
                        {"role": "user", "content": "Please summarize the above."}], tools, scripted=script)
    assert r.content == "SUMMARY" and not r.tool_calls
    # past the last positional step: plain text, no tool call
    assert not decide(after + [call, {"role": "tool", "tool_call_id": "c1", "content": "x"}], tools,
                      scripted=script).tool_calls
