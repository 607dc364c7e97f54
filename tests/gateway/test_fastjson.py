"""The gateway's orjson fast path parses request bodies exactly as `jsonsafe.loads` does: the
same value for every body it accepts, the same BodyError message for every body it refuses."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polar_mq._io import jsonsafe
from polar_mq.proxy_app import fastjson


def outcome(fn, data: bytes):
    try:
        value = fn(data)
    except jsonsafe.BodyError as exc:
        return "error", exc.message
    return "ok", json.dumps(value, sort_keys=False), repr(value)


TRICKY = [
    b'{"a": 9223372036854775807}', b'{"a": 9223372036854775808}', b'{"a": 18446744073709551615}',
    b'{"a": 18446744073709551616}', b'{"a": -9223372036854775808}', b'{"a": -9223372036854775809}',
    b'{"a": [1, {"b": 123456789012345678901234}]}', b'123456789012345678901234', b'1e20', b'-1e300',
    b'{"a": 1e19}', b'{"a": 9.3e18}', b'{"a": 1.5}', b'{"a": NaN}', b'{"a": Infinity}', b'{"a": "\\ud800"}',
    b'[' * 70 + b']' * 70, b'[' * 63 + b']' * 63, b'{"a": 1', b'\xff\xfe', b'"x"', b'null',
    json.dumps({"k": list(range(10))}).encode(), b'{"a": 00}', b'{"a": 1}{"b": 2}',
]


@pytest.mark.parametrize("data", TRICKY)
def test_tricky_bodies_match_jsonsafe(data: bytes) -> None:
    assert outcome(fastjson.loads_body, data) == outcome(jsonsafe.loads, data)


def test_too_many_values_match_jsonsafe() -> None:
    data = json.dumps([0] * (jsonsafe.MAX_NODES + 5)).encode()
    assert outcome(fastjson.loads_body, data) == outcome(jsonsafe.loads, data)
    assert outcome(fastjson.loads_body, data)[0] == "error"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2 ** 70), max_value=2 ** 70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_random_bodies_match_jsonsafe(value) -> None:
    data = json.dumps(value).encode()
    assert outcome(fastjson.loads_body, data) == outcome(jsonsafe.loads, data)
