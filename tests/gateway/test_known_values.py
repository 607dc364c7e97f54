"""fastjson.KnownValues: a body whose tool definitions are known is parsed without them, and gives
exactly what parsing it whole gives, whatever else the body holds and wherever the text recurs."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polar_mq._io import jsonsafe
from polar_mq.proxy_app import fastjson
from polar_mq.proxy_app.adapters.base import GatewayError
from polar_mq.proxy_app.fastjson import KnownValues

REPLAY = Path(__file__).resolve().parents[1] / "replays" / "claude_code" / "anthropic.json"


def claude_code_body() -> dict:
    recorded = json.loads(REPLAY.read_text())["requests"]
    return max((r["body"] for r in recorded if r.get("generation")), key=lambda b: len(json.dumps(b)))


TOOLS = claude_code_body()["tools"]
TOOLS_JSON = orjson.dumps(TOOLS)


def learnt() -> KnownValues:
    known = KnownValues()
    known.loads(orjson.dumps({"model": "m", "tools": TOOLS}))
    assert len(known._entries) == 1
    return known


def test_a_real_claude_code_body_reuses_its_tools_and_parses_the_same():
    body = claude_code_body()
    data = orjson.dumps(body)
    known = KnownValues()
    first, second = known.loads(data), known.loads(data)
    assert first == second == orjson.loads(data)
    third = known.loads(orjson.dumps({**body, "messages": body["messages"][:1]}))
    assert third["tools"] is second["tools"]  # parsed once, shared
    assert third == {**body, "messages": body["messages"][:1]}


def test_spaced_json_is_not_learnt_and_still_parses():
    data = json.dumps({"model": "m", "tools": TOOLS}).encode()  # Python's ", " and ": "
    known = KnownValues()
    assert known.loads(data) == json.loads(data)
    assert known._entries == []


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**63) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["tools", "a", 'x"tools', "tools\\", "t"]) | st.text(max_size=4), inner, max_size=4),
    max_leaves=12)


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    """Compact JSON objects where the known tools' text may be the top-level value, a nested one,
    a duplicate key's value, a string, or absent."""
    members: list[bytes] = []
    for _ in range(draw(st.integers(0, 4))):
        key = draw(st.sampled_from(["tools", "a", 'x"tools', "messages"]))
        where = draw(st.sampled_from(["known", "nested", "string", "other"]))
        if where == "known":
            value = TOOLS_JSON
        elif where == "nested":
            value = b'{"tools":' + TOOLS_JSON + b"}"
        elif where == "string":
            value = orjson.dumps(TOOLS_JSON.decode())
        else:
            value = orjson.dumps(draw(json_values))
        members.append(orjson.dumps(key) + b":" + value)
    return b"{" + b",".join(members) + b"}"


@settings(max_examples=300, deadline=None)
@given(bodies())
def test_any_body_parses_as_orjson_parses_it(data: bytes):
    known = learnt()
    expected = orjson.loads(data)
    assert known.loads(data) == expected
    assert known.loads(data) == expected  # learnt from it, or not: the same


def test_the_limits_count_the_known_value_too(monkeypatch):
    known = learnt()
    values = known._entries[0][2]
    monkeypatch.setattr(fastjson, "KNOWN", known)
    small = {"model": "m", "tools": TOOLS, "extra": list(range(50))}
    monkeypatch.setattr(jsonsafe, "MAX_NODES", values + 40)  # the rest alone fits, together not
    with pytest.raises(GatewayError) as cut:
        fastjson.request_object(orjson.dumps(small))
    monkeypatch.setattr(fastjson, "KNOWN", KnownValues())
    with pytest.raises(GatewayError) as whole:
        fastjson.request_object(orjson.dumps(small))
    assert cut.value.message == whole.value.message and "values" in cut.value.message
    monkeypatch.setattr(jsonsafe, "MAX_NODES", values + 60)
    monkeypatch.setattr(fastjson, "KNOWN", known)
    assert fastjson.request_object(orjson.dumps(small)) == small


def outcome(known: KnownValues, data: bytes, monkeypatch) -> object:
    monkeypatch.setattr(fastjson, "KNOWN", known)
    try:
        return fastjson.request_object(data)
    except GatewayError as exc:
        return exc.message


def deep_tools(levels: int) -> list:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"x": schema}}
    return [{"name": "deep", "description": "d" * 5000, "input_schema": schema}]


def test_depth_counts_the_known_value_at_its_place(monkeypatch):
    """Around the depth limit, a body through its known tools is accepted or refused exactly as
    the same body parsed whole (tools learnt at the top level sit one level deeper in a body)."""
    seen = set()
    for levels in range(25, 35):
        tools = deep_tools(levels)
        known = KnownValues()
        known._learn(orjson.dumps({"tools": tools}), len(b'{"tools":'), tools)
        body = orjson.dumps({"model": "m", "tools": tools})
        cut, whole = outcome(known, body, monkeypatch), outcome(KnownValues(), body, monkeypatch)
        assert cut == whole
        if not isinstance(cut, str):  # accepted: through the known value
            assert isinstance(cut, dict) and cut["tools"] is known._entries[0][1]
        seen.add(isinstance(cut, str))
    assert seen == {True, False}  # the limit was crossed
