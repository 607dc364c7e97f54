"""A chat template rendered as vLLM renders it (Jinja's immutable sandbox, `tojson`,
`raise_exception`, `strftime_now`, tool-call arguments given as JSON strings parsed to objects).
The gateway's local tokenizer and the stand-in model server both render through it, so the
token-in prompt and the server's own rendering agree (tests/tito/test_tito.py)."""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any


def prepare_message(m: Any) -> Any:
    """Like vLLM: tool-call ``arguments`` given as JSON strings are parsed to objects."""
    if not isinstance(m, dict) or not m.get("tool_calls"):
        return m
    out = dict(m)
    calls = []
    for tc in m["tool_calls"] or []:
        tc = dict(tc)
        fn = tc.get("function")
        if isinstance(fn, dict):
            fn = dict(fn)
            fn["arguments"] = _parse_args(fn.get("arguments"))
            tc["function"] = fn
        elif "arguments" in tc:
            tc["arguments"] = _parse_args(tc.get("arguments"))
        calls.append(tc)
    out["tool_calls"] = calls
    return out


def _parse_args(args: Any) -> Any:
    if args is None:
        return {}
    if isinstance(args, str):
        if not args.strip():
            return {}
        try:
            return json.loads(args)
        except ValueError:
            return args
    return args


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    import datetime

    return datetime.datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def compile_template(source: str) -> Any:
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)
