"""Gateway -> real vLLM with the official SDKs for each provider API.

The overfit tiny model answers "write a file" with a ``<tool_call>`` (write polar.txt) and the tool
result with a final text. Each capture record must carry vLLM's real ids and logprobs:
* ``prompt_token_ids`` == vLLM's /tokenize of the recorded messages + tools;
* ``completion_token_ids`` detokenised by vLLM == the text the client saw (text, or the
  ``<tool_call>`` JSON of the call the client got), plus the end-of-turn token;
* the next turn's prompt starts with the previous prompt + sampled ids (prefix property), so
  prefix_merging gives one trace.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import requests

SERVED = "tiny"
ASK = "Write hello from polar to polar.txt."
TOOL_RESULT = "Wrote 16 bytes to polar.txt"
WRITE_SCHEMA = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "description": "File path"},
        "content": {"type": "string", "description": "File content"},
    },
    "required": ["path", "content"],
}
DESC = "Write content to a file."
EXPECTED_ARGS = {"path": "polar.txt", "content": "hello from polar"}
FINAL_TEXT = "Done. I wrote polar.txt."
EOT = "<|im_end|>"
MAX = 96


# ---- one tool round trip per provider, returning what the client saw --------------------------

def _openai_chat(s: dict, stream: bool) -> list[dict]:
    import openai

    c = openai.OpenAI(base_url=s["base_urls"]["openai"], api_key=s["key"], max_retries=0)
    tools = [{"type": "function", "function": {"name": "write", "description": DESC, "parameters": WRITE_SCHEMA}}]
    msgs: list[dict[str, Any]] = [{"role": "user", "content": ASK}]
    seen = []
    first = c.chat.completions.create(model=SERVED, messages=msgs, tools=tools, max_tokens=MAX)
    m = first.choices[0].message
    seen.append({"text": m.content or "", "calls": [(t.function.name, json.loads(t.function.arguments))
                                                    for t in m.tool_calls or []]})
    call = m.tool_calls[0]
    msgs += [m.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": TOOL_RESULT}]
    if stream:
        text = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
            model=SERVED, messages=msgs, tools=tools, max_tokens=MAX, stream=True) if ch.choices)
    else:
        text = c.chat.completions.create(model=SERVED, messages=msgs, tools=tools, max_tokens=MAX).choices[0].message.content
    seen.append({"text": text or "", "calls": []})
    return seen


def _openai_responses(s: dict, stream: bool) -> list[dict]:
    import openai

    c = openai.OpenAI(base_url=s["base_urls"]["openai"], api_key=s["key"], max_retries=0)
    tools = [{"type": "function", "name": "write", "description": DESC, "parameters": WRITE_SCHEMA}]
    seen = []
    if stream:
        with c.responses.stream(model=SERVED, input=ASK, tools=tools, max_output_tokens=MAX) as st:
            first = st.get_final_response()
    else:
        first = c.responses.create(model=SERVED, input=ASK, tools=tools, max_output_tokens=MAX)
    calls = [i for i in first.output if i.type == "function_call"]
    seen.append({"text": first.output_text or "", "calls": [(i.name, json.loads(i.arguments)) for i in calls]})
    items = [{"role": "user", "content": ASK}, calls[0].model_dump(exclude_none=True),
             {"type": "function_call_output", "call_id": calls[0].call_id, "output": TOOL_RESULT}]
    second = c.responses.create(model=SERVED, input=items, tools=tools, max_output_tokens=MAX)
    seen.append({"text": second.output_text or "", "calls": []})
    return seen


def _anthropic(s: dict, stream: bool) -> list[dict]:
    import anthropic

    c = anthropic.Anthropic(base_url=s["base_urls"]["anthropic"], api_key=s["key"], max_retries=0)
    tools = [{"name": "write", "description": DESC, "input_schema": WRITE_SCHEMA}]
    msgs: list[dict[str, Any]] = [{"role": "user", "content": ASK}]
    seen = []
    first = c.messages.create(model=SERVED, max_tokens=MAX, messages=msgs, tools=tools)
    uses = [b for b in first.content if b.type == "tool_use"]
    seen.append({"text": "".join(b.text for b in first.content if b.type == "text"),
                 "calls": [(b.name, b.input) for b in uses]})
    msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": TOOL_RESULT}]}]
    if stream:
        with c.messages.stream(model=SERVED, max_tokens=MAX, messages=msgs, tools=tools) as st:
            second = st.get_final_message()
    else:
        second = c.messages.create(model=SERVED, max_tokens=MAX, messages=msgs, tools=tools)
    seen.append({"text": "".join(b.text for b in second.content if b.type == "text"), "calls": []})
    return seen


def _gemini(s: dict, stream: bool) -> list[dict]:
    from google import genai
    from google.genai import types

    c = genai.Client(api_key=s["key"], http_options=types.HttpOptions(base_url=s["base_urls"]["gemini"]))
    decl = types.FunctionDeclaration(name="write", description=DESC, parameters_json_schema=WRITE_SCHEMA)
    config = types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=[decl])], max_output_tokens=MAX,
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True))
    contents: list[Any] = [types.Content(role="user", parts=[types.Part(text=ASK)])]
    seen = []
    first = c.models.generate_content(model=SERVED, contents=contents, config=config)
    calls = first.function_calls or []
    seen.append({"text": "".join(p.text or "" for p in first.candidates[0].content.parts if not p.function_call),
                 "calls": [(fc.name, dict(fc.args)) for fc in calls]})
    contents += [first.candidates[0].content,
                 types.Content(role="user", parts=[types.Part(function_response=types.FunctionResponse(
                     id=calls[0].id, name=calls[0].name, response={"result": TOOL_RESULT}))])]
    if stream:
        text = "".join(ch.text or "" for ch in c.models.generate_content_stream(
            model=SERVED, contents=contents, config=config))
    else:
        text = c.models.generate_content(model=SERVED, contents=contents, config=config).text
    seen.append({"text": text or "", "calls": []})
    return seen


ROUND_TRIPS = {"openai_chat": _openai_chat, "openai_responses": _openai_responses,
               "anthropic": _anthropic, "gemini": _gemini}

_TOOL_RE = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.S)


def _vllm_tokenize(vllm_url: str, messages: list[dict], tools: list[dict] | None) -> list[int]:
    body: dict[str, Any] = {"model": SERVED, "messages": messages, "add_generation_prompt": True}
    if tools:
        body["tools"] = tools
    r = requests.post(f"{vllm_url}/tokenize", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("provider", sorted(ROUND_TRIPS))
def test_sdk_round_trip_records_real_vllm_ids(vllm_gateway, vllm_url, detokenize, provider, stream):
    s = vllm_gateway.new_session()
    seen = ROUND_TRIPS[provider](s, stream)
    calls = vllm_gateway.calls(s["session_id"])
    assert [c["provider"] for c in calls] == [provider, provider]
    assert [c["status"] for c in calls] == ["ok", "ok"], [c["error"] for c in calls]
    assert [c["finish_reason"] for c in calls] == ["tool_calls", "stop"]

    # what the overfit model said, as the client saw it
    assert seen[0]["calls"] == [("write", EXPECTED_ARGS)]
    assert seen[1]["text"] == FINAL_TEXT and seen[1]["calls"] == []

    for rec, client in zip(calls, seen):
        assert rec["model_served"] == SERVED
        p, ids, lps = rec["prompt_token_ids"], rec["completion_token_ids"], rec["completion_logprobs"]
        assert p and ids and len(lps) == len(ids)
        assert all(isinstance(x, float) and x <= 0.0 for x in lps)
        # the prompt ids are vLLM's rendering of exactly the recorded messages + tools
        assert p == _vllm_tokenize(vllm_url, rec["messages"], rec["tools"])
        # the sampled ids decode (by vLLM) to what the client saw, plus the end of turn
        raw = detokenize(ids)
        assert raw.endswith(EOT), raw
        body = raw[: -len(EOT)]
        got_calls = [json.loads(m.group(1)) for m in _TOOL_RE.finditer(body)]
        text = _TOOL_RE.sub("", body).strip("\n")
        assert text == client["text"]
        assert [(c["name"], c["arguments"]) for c in got_calls] == [(n, a) for n, a in client["calls"]]

    # prefix property: turn 2's prompt starts with turn 1's prompt + sampled ids
    first, second = calls
    head = first["prompt_token_ids"] + first["completion_token_ids"]
    assert second["prompt_token_ids"][: len(head)] == head

    traj = requests.get(f"{vllm_gateway.url}/sessions/{s['session_id']}/trajectory", headers=vllm_gateway.admin_headers,
                        params={"builder": "prefix_merging"}, timeout=10).json()
    assert traj["stats"]["traces"] == 1, traj["stats"]
    trace = traj["traces"][0]
    assert trace["prompt_ids"] + trace["response_ids"] == second["prompt_token_ids"] + second["completion_token_ids"]


def test_vllm_ids_are_what_vllm_samples(vllm_gateway, vllm_url):
    """The recorded completion ids equal a direct, greedy vLLM call with the recorded messages."""
    s = vllm_gateway.new_session()
    _openai_chat(s, stream=False)
    rec = vllm_gateway.calls(s["session_id"])[0]
    direct = requests.post(f"{vllm_url}/v1/chat/completions", json={
        "model": SERVED, "messages": rec["messages"], "tools": rec["tools"], "max_tokens": MAX,
        "temperature": 0, "return_token_ids": True, "logprobs": True}, timeout=60).json()
    assert direct["prompt_token_ids"] == rec["prompt_token_ids"]
    assert direct["choices"][0]["token_ids"] == rec["completion_token_ids"]
    lp = [e["logprob"] for e in direct["choices"][0]["logprobs"]["content"]]
    assert lp == pytest.approx(rec["completion_logprobs"], abs=1e-4)


def test_gateway_health_sees_vllm_token_ids(vllm_gateway):
    h = requests.get(f"{vllm_gateway.url}/health", timeout=10).json()
    text = json.dumps(h)
    assert "token_ids" in text and '"token_ids": true' in text, h


def _connections_opened(gw) -> float:
    text = requests.get(f"{gw.url}/metrics", headers=gw.admin_headers, timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("polar_mq_gateway_upstream_connections_opened_total"))


def test_calls_reuse_the_kept_alive_vllm_connection(vllm_gateway):
    """vLLM (uvicorn) keeps connections alive; the gateway must too: 8 calls, no new connection. A stream read to its [DONE]
    used to close its connection before the chunked terminator, so every call, plain ones included
    (streamed internally), opened a new one."""
    s = vllm_gateway.new_session()
    _openai_chat(s, stream=False)  # warm: at most one connection opened here
    before = _connections_opened(vllm_gateway)
    for stream in (False, True, False, True):
        _openai_chat(s, stream=stream)
    assert _connections_opened(vllm_gateway) - before == 0
    assert len(vllm_gateway.calls(s["session_id"])) == 10  # two calls per round trip
