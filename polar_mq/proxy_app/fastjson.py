"""JSON on the gateway's hot path with orjson: the same values and errors as `jsonsafe` and
`json`, several times faster on the bodies agents send (figures: docs/benchmarks.md,
bench/bench_gateway.py). Guarded by tests/gateway/test_fastjson.py (same values and errors as jsonsafe)
and tests/gateway/test_known_values.py.

`loads_body` keeps `jsonsafe.loads`'s contract exactly: orjson already refuses NaN/Infinity,
lone surrogates and invalid UTF-8, so only nesting depth and value count are left to check
(containers only, no walk over strings). orjson keeps every integer of msgpack's range
[-2**63, 2**64-1] (jsonsafe's too) an int and turns a literal beyond it into a float of magnitude
>= 2**63 silently, so a body holding such a float goes through `jsonsafe.loads`, which rejects the
literal (or, for a real float like 1e20, gives the same value). Whatever orjson refuses goes
through `jsonsafe.loads` too, which gives its own error message. (The float check rides on
the walk the limits need anyway: a regex over the whole body for such literals costs more than
the parse.) A harness's tool definitions, the bulk of its requests and the same on every call,
are parsed once per process and reused (`KnownValues`).
"""

from __future__ import annotations

import re
import secrets
from typing import Any

import orjson

from polar_mq._io import jsonsafe
from polar_mq._io.locks import short_lock
from polar_mq.proxy_app.adapters.base import GatewayError
from polar_mq.proxy_app.shared_values import SHARED

_BIG = float(2 ** 63)  # orjson's float for an integer literal beyond 64 bits is at least this large


def _walk(value: Any, depth0: int = 0) -> tuple[int, int] | None:
    """(values, deepest container level) of `value` placed at level `depth0`, or None when it is
    beyond jsonsafe.check's depth or value-count limits or holds a float that may have been an
    integer literal beyond 64 bits (jsonsafe must judge those)."""
    t = type(value)
    if t is float:
        return (1, depth0) if -_BIG < value < _BIG else None
    if t is not dict and t is not list:
        return 1, depth0
    stack = [(value, depth0)]
    nodes = 1
    deepest = depth0
    while stack:
        item, depth = stack.pop()
        if depth >= jsonsafe.MAX_DEPTH:
            return None
        deepest = max(deepest, depth)
        children = item.values() if type(item) is dict else item
        nodes += len(children)
        if nodes > jsonsafe.MAX_NODES:
            return None
        for child in children:
            t = type(child)
            if t is dict or t is list:
                stack.append((child, depth + 1))
            elif t is float and not -_BIG < child < _BIG:
                return None
    return nodes, deepest


def _plain(value: Any) -> bool:
    """Within jsonsafe.check's limits, and no float that may have been a >64-bit literal."""
    return _walk(value) is not None


def loads_body(data: bytes) -> Any:
    """`jsonsafe.loads` (same values, same BodyError messages), fast for ordinary bodies."""
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        pass
    else:
        if _plain(value):
            return value
    return jsonsafe.loads(data)


loads = orjson.loads  # upstream answers and stream chunks (vLLM writes strict JSON)


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON, key order kept (tool arguments and schemas render into prompts). An
    upstream body whose last key is a shared "tools" list (shared_values.py) reuses that list's
    JSON text: the same bytes, written once per tool set instead of on every call."""
    if type(value) is dict and len(value) > 1:
        tools = value.get("tools")
        if tools is not None and SHARED.is_shared(tools) and next(reversed(value)) == "tools":
            rest = orjson.dumps({k: v for k, v in value.items() if k != "tools"})
            return b"".join((rest[:-1], b',"tools":', SHARED.derive(tools, "json", orjson.dumps), b"}"))
    return jsonsafe.dumps(value)


# A per-process random string that stands in for bytes cut out of a body before parsing: it
# cannot come from the body itself, so where it lands in the parsed value is where the cut was.
CUT = f"\x00polar-cut-{secrets.token_hex(16)}"
_CUT_JSON = orjson.dumps(CUT)


def loads_cut(data: bytes, start: int, end: int, loads: Any = orjson.loads) -> Any:
    """`data` parsed with its bytes [start, end) (one whole JSON value) replaced by the string
    CUT; the caller puts the value it cut out back where CUT landed, and only there."""
    return loads(data[:start] + _CUT_JSON + data[end:])


class KnownValues:
    """Large top-level request values that harnesses send unchanged on every call (their tool
    definitions: 64 KB of the recorded 82 KB Claude Code request), kept as the exact JSON text they
    arrived in and the value parsed from that text once.

    A body whose value at `"tools":` starts with a known text is parsed without it (`loads_cut`),
    and the known value is put back where the cut lands. Only when that is the body's top-level "tools" is the
    cut used (a match inside a nested key, a duplicate key, anything unexpected: the body is parsed
    whole); the limits are checked on the rest plus the value's own counts, so exactly
    the bodies `loads_body` accepts are accepted. Bodies that share one known value share the
    parsed object: nothing on the gateway's path changes a request in place. A value is learnt
    when the body's text at its key is its compact JSON (what JavaScript and Rust clients send)."""

    KEY = re.compile(rb'"tools"\s*:\s*')

    def __init__(self, max_entries: int = 8, min_bytes: int = 4096):
        self.max_entries = max_entries
        self.min_bytes = min_bytes
        self._entries: list[tuple[bytes, Any, int, int]] = []  # (text, value, values, depth)
        self._lock = short_lock()

    def loads(self, data: bytes) -> Any:
        """`loads_body(data)`, through a known value when the body has one."""
        match = self.KEY.search(data)
        at = match.end() if match is not None and data[match.end():match.end() + 1] == b"[" else -1
        if at >= 0:
            body = self._cut(data, at)
            if body is not None:
                return body
        body = loads_body(data)
        if at >= 0 and isinstance(body, dict) and isinstance(body.get("tools"), list):
            self._learn(data, at, body["tools"])
        return body

    def _cut(self, data: bytes, at: int) -> dict[str, Any] | None:
        with self._lock:
            found = next((e for e in self._entries if data.startswith(e[0], at)), None)
        if found is None:
            return None
        text, value, values, depth = found
        try:
            body = loads_cut(data, at, at + len(text))
        except orjson.JSONDecodeError:
            return None
        if not isinstance(body, dict) or body.get("tools") != CUT:
            return None
        counted = _walk(body)
        if counted is None or counted[0] - 1 + values > jsonsafe.MAX_NODES or depth + 1 >= jsonsafe.MAX_DEPTH:
            return None  # the whole body decides (and names the error)
        body["tools"] = value
        return body

    def _learn(self, data: bytes, at: int, value: list[Any]) -> None:
        try:
            text = orjson.dumps(value)
        except TypeError:
            return
        if len(text) < self.min_bytes or not data.startswith(text, at):
            return
        parsed = orjson.loads(text)  # the value is exactly what its text parses to
        counted = _walk(parsed)
        if counted is None:
            return
        with self._lock:
            if any(e[0] == text for e in self._entries):
                return
            self._entries.insert(0, (text, parsed, counted[0], counted[1]))
            del self._entries[self.max_entries:]
        SHARED.share(parsed)  # handed to every body that carries it: derive from it once


KNOWN = KnownValues()


def request_object(data: bytes) -> dict[str, Any]:
    """A provider request body as the gateway accepts it — a JSON object within jsonsafe's limits —
    or a GatewayError (400 in the caller's own format, never a 500). Shared by the Flask routes
    and the WSGI fast path (fastpath.py), which must refuse exactly the same bodies."""
    if not data.strip():
        raise GatewayError("invalid_request", "request body is empty; expected a JSON object")
    try:
        body = KNOWN.loads(data)  # NaN, lone surrogates, >64-bit ints, depth: 400, never 500
    except jsonsafe.BodyError as exc:
        what = "not valid JSON" if exc.message.startswith(("invalid JSON", "body is not UTF-8")) else "not accepted"
        raise GatewayError("invalid_request", f"request body is {what}: {exc}") from None
    if not isinstance(body, dict):
        raise GatewayError("invalid_request", f"request body must be a JSON object, got {type(body).__name__}")
    return body
