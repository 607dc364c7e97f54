"""Completion text <-> message: render a scripted reply exactly as the chat template would render
it, "sample" its token ids, parse text back into an OpenAI message (like vLLM's hermes tool parser
plus a ``<think>`` reasoning parser), and split sampled ids into streaming deltas."""

from __future__ import annotations

import codecs
import hashlib
import json
import re
import struct
import uuid
from dataclasses import dataclass, field
from typing import Any

from polar_mq.dev.model_server.script import Reply
from polar_mq.dev.model_server.tokenizer import ChatTokenizer

THINK_OPEN = "<think>\n"
THINK_CLOSE = "\n</think>\n\n"
TOOL_OPEN = "<tool_call>\n"
TOOL_CLOSE = "\n</tool_call>"


def tool_call_json(name: str, arguments: Any) -> str:
    """The JSON line inside ``<tool_call>`` exactly as the template renders it."""
    return json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)


def completion_text(reply: Reply) -> str:
    """The assistant body exactly as the chat template renders the returned message."""
    out = ""
    if reply.reasoning:
        out += THINK_OPEN + reply.reasoning + THINK_CLOSE
    out += reply.content or ""
    for i, tc in enumerate(reply.tool_calls):
        if i > 0 or reply.content:
            out += "\n"
        out += TOOL_OPEN + tool_call_json(tc.name, tc.arguments) + TOOL_CLOSE
    return out


def new_tool_call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


@dataclass
class ParsedCompletion:
    reasoning: str | None
    content: str | None
    tool_calls: list[dict] = field(default_factory=list)  # [{"name", "arguments"(json str)}]


_TOOL_RE = re.compile(r"<tool_call>\n?(.*?)\n?</tool_call>", re.S)


def parse_completion(text: str) -> ParsedCompletion:
    """Split raw generated text into reasoning / content / tool calls."""
    reasoning = None
    rest = text
    if rest.startswith("<think>"):
        end = rest.find("</think>")
        if end < 0:
            r = rest[len("<think>"):]
            reasoning = r[1:] if r.startswith("\n") else r
            rest = ""
        else:
            r = rest[len("<think>"):end]
            if r.startswith("\n"):
                r = r[1:]
            if r.endswith("\n"):
                r = r[:-1]
            reasoning = r
            rest = rest[end + len("</think>"):]
            if rest.startswith("\n\n"):
                rest = rest[2:]
    calls = []
    idx = rest.find("<tool_call>")
    if idx >= 0:
        content = rest[:idx]
        if content.endswith("\n"):
            content = content[:-1]
        for m in _TOOL_RE.finditer(rest[idx:]):
            try:
                obj = json.loads(m.group(1))
            except ValueError:
                continue
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                continue
            args = obj.get("arguments", obj.get("parameters", {}))
            calls.append({"name": obj["name"], "arguments": json.dumps(args, ensure_ascii=False)})
        if not calls:
            content = rest
        return ParsedCompletion(reasoning, content if content else None, calls)
    return ParsedCompletion(reasoning, rest, [])


# ---- deterministic logprobs -----------------------------------------------------------------

def _unit(*parts: Any) -> float:
    h = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return struct.unpack(">Q", h)[0] / 2**64


def sampled_logprob(token_id: int, position: int) -> float:
    """A plausible log-probability in (-0.7, -0.0001] for a greedily sampled token."""
    return -round(0.0001 + 0.7 * _unit("lp", token_id, position) ** 2, 6)


def top_logprobs(tok: ChatTokenizer, token_id: int, position: int, k: int,
                 as_ids: bool = False) -> list[dict]:
    """k alternatives, the sampled token first (greedy sampling -> it is the top token)."""
    def name(t: int) -> str:
        return f"token_id:{t}" if as_ids else tok.token_str(t)

    lp = sampled_logprob(token_id, position)
    out = [{"token": name(token_id), "logprob": lp, "bytes": tok.token_bytes(token_id)}]
    seen = {token_id}
    j = 0
    cur = lp
    while len(out) < k and j < 10 * k + 10:
        alt = int(_unit("alt", token_id, position, j) * min(tok.vocab_size, 4096))
        j += 1
        if alt in seen:
            continue
        seen.add(alt)
        cur = round(cur - 0.5 - 3.0 * _unit("gap", token_id, position, j), 6)
        out.append({"token": name(alt), "logprob": cur, "bytes": tok.token_bytes(alt)})
    return out


def logprob_entries(tok: ChatTokenizer, ids: list[int], start: int, k: int | None,
                    as_ids: bool = False) -> list[dict]:
    entries = []
    for i, t in enumerate(ids):
        pos = start + i
        entry = {
            "token": f"token_id:{t}" if as_ids else tok.token_str(t),
            "logprob": sampled_logprob(t, pos),
            "bytes": tok.token_bytes(t),
            "top_logprobs": top_logprobs(tok, t, pos, k, as_ids) if k else [],
        }
        entries.append(entry)
    return entries


# ---- streaming segmentation -----------------------------------------------------------------

@dataclass
class Region:
    start: int
    end: int
    kind: str  # "reasoning" | "content" | "args" | "frame"
    call: int = -1  # tool-call index for header/args


def regions_for(reply: Reply) -> tuple[list[Region], list[tuple[int, int]]]:
    """Char regions of :func:`completion_text` and, per tool call, the offset where its header
    (``<tool_call>\\n{"name": ..., "arguments": ``) is complete."""
    regions: list[Region] = []
    headers: list[tuple[int, int]] = []
    pos = 0

    def add(kind: str, text: str, call: int = -1) -> None:
        nonlocal pos
        if text:
            regions.append(Region(pos, pos + len(text), kind, call))
            pos += len(text)

    if reply.reasoning:
        add("frame", THINK_OPEN)
        add("reasoning", reply.reasoning)
        add("frame", THINK_CLOSE)
    add("content", reply.content or "")
    for i, tc in enumerate(reply.tool_calls):
        if i > 0 or reply.content:
            add("frame", "\n")
        full = tool_call_json(tc.name, tc.arguments)
        args = json.dumps(tc.arguments, ensure_ascii=False)
        head = full[: len(full) - len(args) - 1]
        add("frame", TOOL_OPEN + head)
        headers.append((pos, i))
        add("args", args, i)
        add("frame", "}" + TOOL_CLOSE)
    return regions, headers


def token_deltas(tok: ChatTokenizer, reply: Reply, ids: list[int], call_ids: list[str],
                 call_names: list[str], limit: int | None = None) -> list[dict | None]:
    """vLLM's streaming view: one entry per sampled token, the delta that token produced (None when
    it produced nothing visible: template frame, ``<tool_call>`` tokens, the end of turn).

    Like vLLM's hermes tool parser, a tool call's header delta (``content: null``, ``id``, ``type``,
    ``index``, ``function.name`` -- no ``arguments`` key) comes with the token that completes the
    name string; argument deltas (``content: null``, ``index``, ``function.arguments``) follow with
    the argument tokens, and the closing ``}`` of the outer object is never streamed."""
    regions, _headers = regions_for(reply)
    # offset right after the closing quote of each call's name
    full = completion_text(reply)
    name_ends: dict[int, int] = {}
    for r in regions:
        if r.kind == "frame" and "<tool_call>" in full[r.start:r.end]:
            text = full[r.start:r.end]
            call = sum(1 for x in regions if x.kind == "args" and x.start < r.start)
            key = '{"name": '
            j = text.find(key)
            if j >= 0 and call < len(call_names):
                name_ends[call] = r.start + j + len(key) + len(json.dumps(call_names[call], ensure_ascii=False))
    dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pos = 0
    out: list[dict | None] = []
    for t in ids:
        piece = dec.decode(tok.raw_bytes(t))
        start, end = pos, pos + len(piece)
        pos = end
        delta: dict[str, Any] = {}
        calls: list[dict] = []
        for call, ne in sorted(name_ends.items()):
            if start < ne <= end and (limit is None or ne <= limit):
                calls.append({"id": call_ids[call], "type": "function", "index": call,
                              "function": {"name": call_names[call]}})
        for r in regions:
            lo, hi = max(start, r.start), min(end, r.end)
            if limit is not None:
                hi = min(hi, limit)
            if lo >= hi:
                continue
            text = piece[lo - start: hi - start]
            if r.kind == "reasoning":
                delta["reasoning"] = delta.get("reasoning", "") + text
            elif r.kind == "content":
                delta["content"] = delta.get("content", "") + text
            elif r.kind == "args":
                if calls and calls[-1]["index"] == r.call:  # same token as the header, or a
                    fn = calls[-1]["function"]  # token spanning two argument regions: never lose text
                    fn["arguments"] = fn.get("arguments", "") + text
                    continue
                calls.append({"index": r.call, "function": {"arguments": text}})
        if calls:
            delta = {"content": delta.get("content"), **({"reasoning": delta["reasoning"]} if "reasoning" in delta else {}),
                     "tool_calls": calls}
        out.append(delta or None)
    return out

