"""Every 5xx the fuzzers found (issue 13), as regression cases against the real gateway and API:
each is a 400 in the caller's own error shape, answered at once (streams too), and the services
keep answering normal calls afterwards."""

from __future__ import annotations

import json

import pytest
import requests

from tests.support.servers import AUTH

DEEP = "[" * 5000 + "]" * 5000
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi polar:notool"}]}
ANTHROPIC = {"model": "m", "max_tokens": 32, "messages": [{"role": "user", "content": "hi polar:notool"}]}
RESPONSES = {"model": "m", "input": "hi polar:notool"}
GEMINI = {"contents": [{"role": "user", "parts": [{"text": "hi polar:notool"}]}]}


def routes(session: dict) -> dict[str, tuple[str, dict]]:
    base = session["base_urls"]
    return {"openai_chat": (f"{base['openai']}/chat/completions", CHAT),
            "anthropic": (f"{base['anthropic']}/v1/messages", ANTHROPIC),
            "openai_responses": (f"{base['openai']}/responses", RESPONSES),
            "gemini": (f"{base['gemini']}/v1beta/models/m:generateContent", GEMINI)}


def stream_url(provider: str, url: str, body: dict) -> tuple[str, dict]:
    if provider == "gemini":
        return url.replace(":generateContent", ":streamGenerateContent") + "?alt=sse", body
    return url, {**body, "stream": True}


def assert_provider_400(provider: str, resp: requests.Response) -> str:
    assert resp.status_code == 400, (provider, resp.status_code, resp.text[:300])
    body = resp.json()
    if provider == "anthropic":
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        message = body["error"]["message"]
    elif provider == "gemini":
        assert body["error"]["code"] == 400 and body["error"]["status"] == "INVALID_ARGUMENT"
        message = body["error"]["message"]
    else:
        assert body["error"]["type"] == "invalid_request_error"
        message = body["error"]["message"]
    assert resp.headers.get("x-should-retry") == "false"
    return message


def bad_bodies(body: dict, provider: str) -> dict[str, bytes]:
    """The fuzzers' findings, applied to a valid body of `provider`."""
    text_path = {"openai_chat": ("messages", 0, "content"), "anthropic": ("messages", 0, "content"),
                 "openai_responses": ("input",), "gemini": ("contents", 0, "parts", 0, "text")}[provider]

    def with_text(value: str) -> dict:
        out = json.loads(json.dumps(body))
        node = out
        for step in text_path[:-1]:
            node = node[step]
        node[text_path[-1]] = value
        return out

    big = {**body, "metadata": {"n": 2**70}} if provider != "gemini" else {**body, "labels": {"n": 2**70}}
    tools = {"openai_chat": {"tools": [{"type": "function", "function": {"name": "f", "parameters": {
                 "type": "object", "properties": {"x": {"type": "integer", "maximum": 2**70}}}}}]},
             "anthropic": {"tools": [{"name": "f", "input_schema": {"type": "object", "properties": {
                 "x": {"type": "integer", "maximum": 2**70}}}}]},
             "openai_responses": {"tools": [{"type": "function", "name": "f", "parameters": {
                 "type": "object", "properties": {"x": {"type": "integer", "maximum": 2**70}}}}]},
             "gemini": {"tools": [{"functionDeclarations": [{"name": "f", "parametersJsonSchema": {
                 "type": "object", "properties": {"x": {"type": "integer", "maximum": 2**70}}}}]}]}}[provider]
    temperature = ({**body, "generationConfig": {"temperature": "NaN"}} if provider == "gemini"
                   else {**body, "temperature": "NaN"})
    return {
        "deep": DEEP.encode(),
        "deep_in_body": json.dumps({**body, "metadata": {"x": 1}}).replace('{"x": 1}', DEEP).encode(),
        "lone_surrogate": json.dumps(with_text("hi \ud800 there")).encode(),
        "int_2_70_metadata": json.dumps(big).encode(),
        "int_2_70_tool_schema": json.dumps({**body, **tools}).encode(),
        "temperature_nan": json.dumps(temperature).replace('"NaN"', "NaN").encode(),
        "infinity": json.dumps(temperature).replace('"NaN"', "1e999").encode(),
    }


@pytest.mark.parametrize("provider", ["openai_chat", "anthropic", "openai_responses", "gemini"])
def test_fuzz_findings_are_400s_and_streams_end(gateway, provider):
    s = gateway.new_session()
    url, body = routes(s)[provider]
    for name, raw in bad_bodies(body, provider).items():
        resp = requests.post(url, data=raw, headers={"Content-Type": "application/json"}, timeout=10)
        assert_provider_400(provider, resp)
        if name == "deep":
            continue
        surl, sbody = stream_url(provider, url, json.loads(json.dumps(body)))
        streamed = raw if provider == "gemini" else raw.replace(b"{", b'{"stream": true, ', 1)
        # A bad stream request ends at once with a 400 (it used to get 200 + pings forever).
        resp = requests.post(surl, data=streamed, headers={"Content-Type": "application/json"}, timeout=10)
        assert_provider_400(provider, resp)
    assert gateway.calls(s["session_id"]) == []  # nothing was sent upstream for them
    ok = requests.post(url, json=body, timeout=30)
    assert ok.status_code == 200, ok.text
    assert len(gateway.calls(s["session_id"])) == 1


def test_gateway_logs_never_show_session_keys(gateway):
    s = gateway.new_session()
    url = f"{s['base_urls']['openai']}/chat/completions"
    requests.post(url, data=DEEP, headers={"Content-Type": "application/json"}, timeout=10)
    requests.get(f"{gateway.url}/s/{s['key']}/no/such/route", timeout=10)
    requests.post(f"{gateway.url}/s/{s['key']}/v1/chat/completions", data=b"\xff\xfe", timeout=10)
    assert s["key"] not in gateway.server.output()


# --- rollout API -------------------------------------------------------------------------------
TASK = {"instruction": "say hi", "agent": {"harness": "shell", "options": {"command": "echo hi"}}}


def api_bodies() -> dict[str, tuple[bytes, str]]:
    deep_yaml = "instruction: x\nagent: {harness: shell, options: {command: echo}}\nmetadata: " + \
        "[" * 5000 + "]" * 5000 + "\n"
    laughs = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n" for p, c in zip("abcdefgh", "bcdefghi")) + \
        "instruction: x\nagent: {harness: shell, options: {command: echo}}\nmetadata: {m: *i}\n"
    js = "application/json"
    return {
        "deep_json": (json.dumps({**TASK, "metadata": {"x": 1}}).replace('{"x": 1}', DEEP).encode(), js),
        "deep_yaml": (deep_yaml.encode(), "application/yaml"),
        "billion_laughs_yaml": (laughs.encode(), "application/yaml"),
        "int_2_70_metadata": (json.dumps({**TASK, "metadata": {"n": 2**70}}).encode(), js),
        "int_2_70_cpus": (json.dumps({**TASK, "runtime": {"cpus": 2**70}}).encode(), js),
        "lone_surrogate": (json.dumps({**TASK, "instruction": "hi \ud800"}).encode(), js),
        "nan_timeout": (json.dumps({**TASK, "timeout_seconds": 1.0}).replace("1.0", "NaN").encode(), js),
        "yaml_date_and_int_keys": (b"instruction: x\nagent: {harness: shell, options: {command: echo}}\n"
                                   b"metadata: {1: a, when: 2024-01-01}\n", "application/yaml"),
    }


def test_api_fuzz_findings_are_400_problems(log_dir, redis_url):
    from tests.api.test_api import start_api
    from tests.support.servers import stop

    server = start_api(log_dir, redis_url.rsplit("/", 1)[0] + "/12", name="api-bad-input")
    try:
        for name, (raw, ctype) in api_bodies().items():
            resp = requests.post(f"{server.url}/v1/tasks", data=raw, timeout=20,
                                 headers={**AUTH, "Content-Type": ctype})
            assert resp.status_code == 400, (name, resp.status_code, resp.text[:300])
            assert resp.headers["Content-Type"].startswith("application/problem+json")
            assert resp.json()["field"], name
        ok = requests.post(f"{server.url}/v1/tasks", json=TASK, headers=AUTH, timeout=20)
        assert ok.status_code == 202, ok.text
    finally:
        stop(server.proc)
