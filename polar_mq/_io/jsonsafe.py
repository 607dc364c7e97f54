"""Untrusted JSON (and YAML) bodies, checked once at the edge so that what is accepted can be stored.

Everything the gateway and the API accept ends up msgpack-encoded in Redis (records, tasks) and
JSON-encoded upstream. Python's parsers accept more than those encoders can write: NaN and
Infinity, lone surrogates (``"\\ud800"``), integers beyond 64 bits, nesting deep enough to blow the
stack (or msgpack's 512-level limit), and from YAML dates, binary and non-string keys. Such a body
would pass a plain parse and then fail while being stored (a 500, a stream that never ended, a
lost record). `loads` and `check` turn each of those into a `BodyError` naming where it is, which
the services answer as a 400 in the caller's own error shape (tests/trust/test_trust_bad_input.py,
tests/api/test_fuzz_api.py, tests/gateway/test_fuzz_gateway.py).
"""

from __future__ import annotations

import json
import math
from types import ModuleType
from typing import Any

_orjson: ModuleType | None
try:
    import orjson as _orjson
except ImportError:  # the vLLM venv (scripts/build_tiny_model.py imports the adapters there)
    _orjson = None

MAX_DEPTH = 64  # real requests nest < 20 levels (tool schemas included); msgpack stops at 512
MAX_NODES = 2_000_000  # YAML aliases can make a small document a huge tree
INT_MIN, INT_MAX = -(2**63), 2**64 - 1  # what msgpack can encode


class BodyError(ValueError):
    """A body that cannot be accepted; `where` is a JSON-path-like location ("messages[0].content")."""

    def __init__(self, message: str, where: str = ""):
        super().__init__(f"{message} at {where}" if where else message)
        self.message = message
        self.where = where


def _reject_constant(name: str) -> float:
    raise BodyError(f"{name} is not valid JSON (numbers must be finite)")


def loads(data: bytes | str) -> Any:
    """`json.loads` that rejects NaN/Infinity and over-deep nesting, then `check`s the result.
    Raises BodyError (invalid JSON included: its message says where)."""
    try:
        value = json.loads(data, parse_constant=_reject_constant)
    except RecursionError:
        raise BodyError(f"JSON nested too deeply (the limit is {MAX_DEPTH} levels)") from None
    except UnicodeDecodeError as exc:
        raise BodyError(f"body is not UTF-8: {exc.reason} at byte {exc.start}") from None
    except json.JSONDecodeError as exc:
        raise BodyError(f"invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    check(value)
    return value


def _label(path: str, key: Any) -> str:
    return f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else str(key))


def check(value: Any, *, max_depth: int = MAX_DEPTH) -> None:
    """Raise BodyError unless `value` is plain JSON that msgpack and strict JSON can encode: dicts
    with string keys, lists, valid Unicode strings, 64-bit integers, finite floats, bools, None."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    nodes = 0
    while stack:
        item, path, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise BodyError(f"body has more than {MAX_NODES} values")
        if isinstance(item, str):
            _check_text(item, path)
        elif isinstance(item, bool) or item is None:
            pass
        elif isinstance(item, int):
            if not INT_MIN <= item <= INT_MAX:
                raise BodyError("integer out of the 64-bit range", path or "body")
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise BodyError("number is not finite", path or "body")
        elif isinstance(item, (dict, list)):
            if depth >= max_depth:
                raise BodyError(f"nested deeper than {max_depth} levels", path or "body")
            if isinstance(item, dict):
                for k, v in item.items():
                    if not isinstance(k, str):
                        raise BodyError(f"object key {k!r} is not a string", path or "body")
                    _check_text(k, path)
                    stack.append((v, _label(path, k), depth + 1))
            else:
                stack.extend((v, _label(path, i), depth + 1) for i, v in enumerate(item))
        else:
            raise BodyError(f"{type(item).__name__} is not a JSON value", path or "body")


def _check_text(text: str, path: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BodyError(f"string holds a lone surrogate (U+{ord(text[exc.start]):04X}), which is not "
                        f"valid Unicode", path or "body") from None


def sanitize(value: Any, *, max_depth: int = MAX_DEPTH, _depth: int = 0) -> Any:
    """A storable copy of `value` for the last line of defence (a record must never vanish): lone
    surrogates become U+FFFD, out-of-range integers and non-finite floats become strings, what
    nests too deep or is not JSON becomes its (shortened) repr."""
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value if INT_MIN <= value <= INT_MAX else str(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, (dict, list, tuple)):
        if _depth >= max_depth:
            return repr(value)[:2000]
        if isinstance(value, dict):
            return {sanitize(str(k)): sanitize(v, max_depth=max_depth, _depth=_depth + 1) for k, v in value.items()}
        return [sanitize(v, max_depth=max_depth, _depth=_depth + 1) for v in value]
    return repr(value)[:2000]


def dumps(value: Any) -> bytes:
    """The one JSON writer of the gateway's replies and frames: compact UTF-8, key order kept (tool
    arguments render into prompts); orjson where it can, the stdlib for what orjson refuses (a
    >64-bit int, a non-str key) or where it is absent (tests/adapters/test_adapters_without_orjson.py,
    tests/gateway/test_fastjson.py)."""
    if _orjson is not None:
        try:
            out: bytes = _orjson.dumps(value)
            return out
        except TypeError:
            pass
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
