"""Hypothesis against the gateway's provider routes (a real gateway process on the stand-in model).

Bodies: valid requests of each provider with fields replaced by values of the wrong type, fields
removed, huge strings, deep nesting, lone surrogates, 2**70, NaN; raw bytes that are not UTF-8,
not JSON, or empty; streamed and not. Every answer must come back (streams end), must not be a
5xx, and an error must be in that provider's own shape; the gateway keeps serving normal calls
afterwards and logs no unhandled error. Bounded by POLAR_FUZZ_EXAMPLES per route.
"""

from __future__ import annotations

import copy
import json
import os

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.servers import start_gateway, stop
from tests.support.fuzz import FUZZ_EXAMPLES, count_case

BASES = {
    "openai_chat": ("/v1/chat/completions", {"model": "m", "max_tokens": 16, "messages": [
        {"role": "user", "content": "hi polar:notool"}]}),
    "anthropic": ("/v1/messages", {"model": "m", "max_tokens": 16, "messages": [
        {"role": "user", "content": "hi polar:notool"}]}),
    "openai_responses": ("/v1/responses", {"model": "m", "max_output_tokens": 16, "input": "hi polar:notool"}),
    "gemini": ("/v1beta/models/m:generateContent", {"contents": [
        {"role": "user", "parts": [{"text": "hi polar:notool"}]}], "generationConfig": {"maxOutputTokens": 16}}),
    "anthropic_count": ("/v1/messages/count_tokens", {"model": "m", "messages": [
        {"role": "user", "content": "hi"}]}),
    "gemini_count": ("/v1beta/models/m:countTokens", {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}),
}
SHAPE = {"openai_chat": "openai", "openai_responses": "openai", "anthropic": "anthropic",
         "anthropic_count": "anthropic", "gemini": "gemini", "gemini_count": "gemini"}

scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**80), max_value=2**80),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40),
                    st.sampled_from(["\ud800", "x" * 100_000, "", "user", "assistant", "tool", "system"]))
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                           st.dictionaries(st.text(max_size=12), inner, max_size=4)),
                           max_leaves=12)


def paths(value, prefix=()):
    """Every location inside a JSON value (dict keys and list indexes)."""
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from paths(v, prefix + (i,))


@st.composite
def mutated(draw, base: dict) -> dict:
    body = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from([p for p in paths(body) if p]))
        parent = body
        for step in where[:-1]:
            parent = parent[step]
        op = draw(st.sampled_from(["replace", "delete", "deep", "add"]))
        if op == "delete":
            parent.pop(where[-1]) if isinstance(parent, dict) else parent.pop(where[-1])
        elif op == "deep":
            deep: object = 1
            for _ in range(draw(st.sampled_from([10, 70, 600]))):
                deep = [deep]
            parent[where[-1]] = deep
        elif op == "add" and isinstance(parent, dict):
            parent[draw(st.sampled_from(["tools", "metadata", "temperature", "stream", "tool_choice", "n",
                                         "response_format", "system", "stop", "seed", "top_p"]))] = draw(json_values)
        else:
            parent[where[-1]] = draw(json_values)
        if not body:
            break
    return body


def encode(body) -> bytes:
    text = json.dumps(body, allow_nan=True)
    return text.encode("utf-8", "surrogatepass")  # lone surrogates as raw (invalid UTF-8) bytes too


raw_bodies = st.one_of(st.just(b""), st.just(b"   "), st.binary(max_size=64), st.just(b"\xff\xfe{}"),
                       st.just(b"[" * 20_000), st.just(b'{"model": "m", "messages": [}'),
                       st.text(max_size=40).map(lambda t: t.encode()), st.just(b"null"), st.just(b"[1, 2]"))


@pytest.fixture(scope="module")
def fuzz_gateway(log_dir, redis_url, model_server):
    server = start_gateway(log_dir, redis_url, [model_server], name="gw-fuzz")
    yield server
    stop(server.proc)


@pytest.fixture(scope="module")
def fuzz_session(fuzz_gateway):
    from tests.support.servers import AUTH

    return requests.post(f"{fuzz_gateway.url}/sessions", json={}, headers=AUTH, timeout=10).json()


def check_answer(route: str, resp: requests.Response) -> None:
    count_case("gateway", resp.status_code)
    assert resp.status_code < 500, (route, resp.status_code, resp.text[:400])
    if resp.status_code < 400:
        return
    body = resp.json()
    shape = SHAPE[route]
    if shape == "anthropic":
        assert body["type"] == "error" and isinstance(body["error"]["message"], str)
    elif shape == "gemini":
        assert body["error"]["code"] == resp.status_code and body["error"]["status"]
    else:
        assert isinstance(body["error"]["message"], str) and "type" in body["error"]


def post(session: dict, route: str, data: bytes, stream: bool) -> requests.Response:
    path, _ = BASES[route]
    url = f"{session['base_urls']['anthropic']}{path}"
    if stream and route == "gemini":
        url = url.replace(":generateContent", ":streamGenerateContent") + "?alt=sse"
    resp = requests.post(url, data=data, headers={"Content-Type": "application/json"}, timeout=(5, 30),
                         stream=True)
    resp._content = b"".join(resp.iter_content(chunk_size=None))  # a stream must end (timeout otherwise)
    return resp


FUZZ = settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=bool(os.environ.get("CI")),
                suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize("route", list(BASES))
def test_mutated_bodies_never_5xx(fuzz_session, route):
    base = BASES[route][1]

    @FUZZ
    @given(body=mutated(base), stream=st.booleans())
    def run(body, stream):
        if stream and route in ("openai_chat", "anthropic", "openai_responses"):
            body = {**body, "stream": True}
        check_answer(route, post(fuzz_session, route, encode(body), stream))

    run()


@pytest.mark.parametrize("route", ["openai_chat", "anthropic", "openai_responses", "gemini"])
def test_raw_bodies_never_5xx(fuzz_session, route):
    @FUZZ
    @given(data=raw_bodies)
    def run(data):
        resp = post(fuzz_session, route, data, False)
        check_answer(route, resp)
        assert resp.status_code == 400, (data[:80], resp.text[:300])  # none of these is a request

    run()


def test_gateway_still_serves_after_fuzzing(fuzz_gateway, fuzz_session):
    for route in ("openai_chat", "anthropic", "openai_responses", "gemini"):
        resp = post(fuzz_session, route, json.dumps(BASES[route][1]).encode(), False)
        assert resp.status_code == 200, (route, resp.text[:300])
    assert fuzz_gateway.proc.poll() is None
    log = fuzz_gateway.output()
    assert "unhandled error" not in log and fuzz_session["key"] not in log, log[-3000:]
