"""shared_values: what the gateway derives from a harness's re-sent tool definitions is computed
once per shared object and is exactly what deriving it again gives (the adapters' chat tools and
notes, the upstream body's bytes); objects that are not shared are derived on every call."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest

from polar_mq.proxy_app import fastjson
from polar_mq.proxy_app.adapters import anthropic, openai_chat
from polar_mq.proxy_app.adapters.base import GatewayError
from polar_mq.proxy_app.fastjson import KnownValues
from polar_mq.proxy_app.shared_values import SharedValues

REPLAY = Path(__file__).resolve().parents[1] / "replays" / "claude_code" / "anthropic.json"


def claude_code_body() -> dict:
    recorded = json.loads(REPLAY.read_text())["requests"]
    return max((r["body"] for r in recorded if r.get("generation")), key=lambda b: len(json.dumps(b)))


def test_derive_once_per_shared_object_and_every_time_otherwise() -> None:
    shared = SharedValues()
    made = []

    def make(obj: list) -> tuple[list, list]:
        made.append(obj)
        return [x * 2 for x in obj], ["note"]

    recurring, fresh = [1, 2], [1, 2]
    shared.share(recurring)
    first = shared.derive(recurring, "double", make)
    assert shared.derive(recurring, "double", make) is first and len(made) == 1
    assert first == ([2, 4], ["note"])
    assert shared.is_shared(first[0]), "a derived list is shared in turn: derivations chain"
    assert shared.derive(fresh, "double", make) == first and shared.derive(fresh, "double", make) is not first
    assert len(made) == 3, "an equal but unshared object is derived on every call"
    assert shared.derive(recurring, "other", lambda o: len(o)) == 2  # each derivation apart


def test_a_failed_derivation_is_not_remembered() -> None:
    shared = SharedValues()
    obj: list = []
    shared.share(obj)
    for _ in range(2):
        with pytest.raises(ValueError):
            shared.derive(obj, "bad", lambda o: (_ for _ in ()).throw(ValueError("no")))


def test_bounded() -> None:
    shared = SharedValues(max_shared=4, max_derived=4)
    objs = [[i] for i in range(10)]
    for o in objs:
        shared.share(o)
        shared.derive(o, "n", len)
    assert len(shared._shared) <= 4 and len(shared._derived) <= 4
    assert not shared.is_shared(objs[0]) and shared.is_shared(objs[-1])


def test_claude_code_tools_are_converted_once_and_every_call_gets_the_same_request() -> None:
    """Two calls with the recorded 82 KB request, parsed through a KnownValues that learnt its
    tools: the second call's chat tools are the first's object, equal to converting them afresh,
    and each call's notes say what was dropped (notes are per call, not shared)."""
    body = claude_code_body()
    body["tools"] = [*body["tools"], {"type": "web_search_20250305", "name": "web_search"}]  # dropped: a note
    data = orjson.dumps(body)
    known = KnownValues()
    known.loads(data)  # learns the tools
    first, second = anthropic.to_chat(known.loads(data)), anthropic.to_chat(known.loads(data))
    afresh = anthropic.to_chat(orjson.loads(data))
    assert first.tools is second.tools
    assert first.tools == afresh.tools and first.notes == second.notes == afresh.notes
    assert any("web_search" in n for n in first.notes)
    first.notes.append("this call only")
    assert "this call only" not in anthropic.to_chat(known.loads(data)).notes


def test_upstream_body_bytes_are_unchanged() -> None:
    """fastjson.dumps of an upstream body carrying shared tools gives orjson's bytes exactly,
    whether "tools" is the last key (spliced from the remembered text) or not."""
    body = claude_code_body()
    data = orjson.dumps(body)
    known = KnownValues()
    known.loads(data)
    req = anthropic.to_chat(known.loads(data))
    upstream = {"model": "m", "messages": req.messages, "max_tokens": 5, "stream": False, "tools": req.tools}
    assert fastjson.dumps(upstream) == orjson.dumps(upstream)
    assert fastjson.dumps(upstream) == orjson.dumps(upstream)  # the second time from the remembered text
    moved = {"tools": req.tools, **{k: v for k, v in upstream.items() if k != "tools"}}
    assert fastjson.dumps(moved) == orjson.dumps(moved)
    assert json.loads(fastjson.dumps(upstream))["tools"] == req.tools


def test_openai_chat_functions_never_change_the_shared_tools() -> None:
    tools = [{"type": "function", "function": {"name": f"t{i}", "parameters": {"type": "object",
              "properties": {"x": {"type": "string", "description": "y" * 400}}}}} for i in range(20)]
    known = KnownValues()
    base = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": tools}
    known.loads(orjson.dumps(base))
    with_functions = orjson.dumps({**base, "functions": [{"name": "legacy", "parameters": {}}]})
    plain = openai_chat.to_chat(known.loads(orjson.dumps(base)))
    legacy = openai_chat.to_chat(known.loads(with_functions))
    assert [t["function"]["name"] for t in legacy.tools][-1] == "legacy"
    assert len(plain.tools) == 20 and len(openai_chat.to_chat(known.loads(orjson.dumps(base))).tools) == 20


def test_bad_tools_are_refused_on_every_call() -> None:
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "t", "description": "d" * 5000}]}  # no input_schema
    known = KnownValues()
    data = orjson.dumps(body)
    for _ in range(3):
        with pytest.raises(GatewayError, match="input_schema"):
            anthropic.to_chat(known.loads(data))


def _schema(i: int) -> dict:
    return {"type": "object", "properties": {"path": {"type": "string", "description": f"file {i} " + "p" * 300}}}


RESPONSES_BODY = {"model": "m", "input": "hi", "tools": [
    *[{"type": "function", "name": f"f{i}", "description": "d", "parameters": _schema(i)} for i in range(12)],
    {"type": "custom", "name": "apply_patch", "description": "patch " + "x" * 500},
    {"type": "web_search"}]}
GEMINI_BODY = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "tools": [
    {"functionDeclarations": [{"name": f"f{i}", "description": "d", "parameters": _schema(i)} for i in range(12)]},
    {"googleSearch": {}}]}


@pytest.mark.parametrize("adapter,body", [("openai_responses", RESPONSES_BODY), ("gemini", GEMINI_BODY)])
def test_every_adapter_converts_shared_tools_once(adapter: str, body: dict) -> None:
    from polar_mq.proxy_app.adapters import gemini, openai_responses

    mod = {"openai_responses": openai_responses, "gemini": gemini}[adapter]
    data = orjson.dumps(body)
    known = KnownValues()
    known.loads(data)
    first, second = mod.to_chat(known.loads(data)), mod.to_chat(known.loads(data))
    afresh = mod.to_chat(orjson.loads(data))
    assert first.tools is second.tools and first.tools == afresh.tools
    assert first.custom_tools == afresh.custom_tools and first.notes == second.notes == afresh.notes
    assert any("dropped" in n for n in first.notes)
