"""Structural comparison of JSON answers: key sets and value types, recursively (not values)."""

from __future__ import annotations

import json
from typing import Any

import requests


def tname(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "str"
    if isinstance(v, list):
        return "list"
    if isinstance(v, dict):
        return "dict"
    return type(v).__name__


def shape(v: Any) -> Any:
    """A hashable description: dict -> sorted (key, shape) tuples; list -> sorted set of element
    shapes (lengths differ between models); scalars -> type name."""
    if isinstance(v, dict):
        return ("dict", tuple(sorted((k, shape(x)) for k, x in v.items())))
    if isinstance(v, list):
        return ("list", tuple(sorted({shape(x) for x in v}, key=repr)))
    return tname(v)


def diff(a: Any, b: Any, path: str = "$") -> list[str]:
    """Human-readable structural differences between a (vLLM) and b (stand-in)."""
    out: list[str] = []
    ta, tb = tname(a), tname(b)
    if ta != tb:
        return [f"{path}: vllm {ta} ({_short(a)}) vs stand-in {tb} ({_short(b)})"]
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in b:
                out.append(f"{path}.{k}: only in vllm ({_short(a[k])})")
            elif k not in a:
                out.append(f"{path}.{k}: only in stand-in ({_short(b[k])})")
            else:
                out += diff(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        if a and b:
            # compare the first elements and every distinct element shape
            out += diff(a[0], b[0], f"{path}[0]")
            sa = {shape(x) for x in a}
            sb = {shape(x) for x in b}
            if len(sa) > 1 or len(sb) > 1:
                if {s for s in sa} != {s for s in sb}:
                    out.append(f"{path}[*]: element shapes differ ({len(sa)} kinds vs {len(sb)})")
        elif a or b:
            out.append(f"{path}: vllm has {len(a)} elements, stand-in {len(b)}")
    return out


def _short(v: Any) -> str:
    s = json.dumps(v, ensure_ascii=False) if not isinstance(v, str) else repr(v)
    return s if len(s) <= 80 else s[:77] + "..."


def sse_events(resp: requests.Response) -> list[Any]:
    """``data:`` payloads of an SSE answer; ``[DONE]`` kept as the string."""
    out = []
    for raw in resp.iter_lines(decode_unicode=True):
        if not raw or not raw.startswith("data:"):
            continue
        data = raw[5:].strip()
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


def chunk_kind(c: Any) -> str:
    """A chunk's role in the sequence (used for the sequence-shape comparison)."""
    if c == "[DONE]":
        return "DONE"
    if not c.get("choices"):
        return "usage" if c.get("usage") else "empty"
    ch = c["choices"][0]
    d = ch.get("delta") or {}
    if ch.get("finish_reason"):
        return "finish"
    if "role" in d:
        return "role"
    if d.get("tool_calls"):
        tc = d["tool_calls"][0]
        return "tool_head" if "id" in tc or "name" in (tc.get("function") or {}) else "tool_args"
    if "reasoning" in d or "reasoning_content" in d:
        return "reasoning"
    if "content" in d:
        return "content"
    return "other:" + ",".join(sorted(d))


def collapse(kinds: list[str]) -> list[str]:
    out: list[str] = []
    for k in kinds:
        if not out or out[-1] != k:
            out.append(k)
    return out
