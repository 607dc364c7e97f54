"""Replay what the real agent CLIs sent (tests/replays/<harness>/<api>.json) against the gateway.

The fixtures are recorded by ``scripts/record_replays.py``: every request a CLI made during a
tool round trip through the gateway (tool call -> tool result -> final text; ``*.think_parallel``
files: with reasoning on every turn and two parallel tool calls), exactly as sent,
with the session key replaced by ``REPLAY_KEY``.  Each fixture is replayed into a fresh session:
every model call gets the status it got when recorded, every generation answer must parse with the
official SDK's types (non-streaming) or follow the provider's required event sequence
(streaming), and one capture record with token ids must be stored per generation call.
No npm/node needed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest
import requests
from pydantic import TypeAdapter

REPLAY_DIR = Path(__file__).resolve().parents[1] / "replays"
REPLAY_KEY = "REPLAY_KEY"
FIXTURES = sorted(REPLAY_DIR.glob("*/*.json"))


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


# ---- SSE parsing -----------------------------------------------------------------------------

def sse_events(text: str) -> Iterator[tuple[str | None, str]]:
    """(event name or None, data) per SSE frame."""
    for frame in text.replace("\r\n", "\n").split("\n\n"):
        if not frame.strip():
            continue
        event, data = None, []
        for line in frame.split("\n"):
            if line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "event":
                event = value
            elif name == "data":
                data.append(value)
        if data:
            yield event, "\n".join(data)


# ---- per-provider response checks ------------------------------------------------------------

def check_anthropic(resp: requests.Response, stream: bool) -> None:
    from anthropic.types import Message, RawMessageStreamEvent

    if not stream:
        msg = Message.model_validate(resp.json())
        assert msg.role == "assistant" and msg.stop_reason in ("end_turn", "tool_use", "max_tokens",
                                                              "stop_sequence")
        return
    adapter = TypeAdapter(RawMessageStreamEvent)
    events = []
    for name, data in sse_events(resp.text):
        obj = json.loads(data)
        assert name == obj["type"], (name, obj)
        if obj["type"] in ("ping",):
            continue
        assert obj["type"] != "error", obj
        events.append(adapter.validate_python(obj))
    types = [e.type for e in events]
    assert types[0] == "message_start" and types[-2:] == ["message_delta", "message_stop"], types
    open_index, next_index = None, 0
    partial_json: dict[int, str] = {}
    for e in events[1:-2]:
        if e.type == "content_block_start":
            assert open_index is None and e.index == next_index, types
            open_index = e.index
            if e.content_block.type == "tool_use":
                partial_json[e.index] = ""
        elif e.type == "content_block_delta":
            assert e.index == open_index, types
            if e.delta.type == "input_json_delta":
                partial_json[e.index] += e.delta.partial_json
        elif e.type == "content_block_stop":
            assert e.index == open_index, types
            open_index, next_index = None, next_index + 1
        else:
            raise AssertionError(f"unexpected event {e.type} inside the message: {types}")
    assert open_index is None and next_index >= 1, types
    for pieces in partial_json.values():
        assert isinstance(json.loads(pieces), dict)
    assert events[-2].usage.output_tokens is not None


def check_openai_chat(resp: requests.Response, stream: bool) -> None:
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    if not stream:
        cc = ChatCompletion.model_validate(resp.json())
        assert cc.choices and cc.choices[0].message.role == "assistant"
        return
    frames = [data for _, data in sse_events(resp.text)]
    assert frames and frames[-1] == "[DONE]", frames[-3:]
    chunks = [ChatCompletionChunk.model_validate(json.loads(d)) for d in frames[:-1]]
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason]
    assert len(finishes) == 1, finishes
    seen_tool: set[int] = set()
    for c in chunks:
        for ch in c.choices:
            for tc in ch.delta.tool_calls or []:
                if tc.index not in seen_tool:  # first delta of a call: id, type, name
                    assert tc.id and tc.function and tc.function.name, tc
                    seen_tool.add(tc.index)


def check_openai_responses(resp: requests.Response, stream: bool) -> None:
    from openai.types.responses import Response, ResponseStreamEvent

    if not stream:
        r = Response.model_validate(resp.json())
        assert r.status == "completed" and r.output
        return
    adapter = TypeAdapter(ResponseStreamEvent)
    events = [adapter.validate_python(json.loads(d)) for _, d in sse_events(resp.text)]
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"], types
    assert types[-1] == "response.completed", types
    seqs = [e.sequence_number for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), seqs
    added = {e.output_index: e.item.id for e in events if e.type == "response.output_item.added"}
    done = {e.output_index: e.item for e in events if e.type == "response.output_item.done"}
    assert added.keys() == done.keys() and added
    for i, item in done.items():
        assert item.id == added[i], (item, added[i])
        if item.type == "function_call":
            assert isinstance(json.loads(item.arguments or "{}"), dict)
    final = events[-1].response
    assert isinstance(final.id, str) and final.id
    assert [o.id for o in final.output] == [done[i].id for i in sorted(done)]
    assert final.usage is not None


def check_gemini(resp: requests.Response, stream: bool) -> None:
    from google.genai.types import GenerateContentResponse

    if not stream:
        r = GenerateContentResponse.model_validate(resp.json())
        assert r.candidates and r.candidates[0].finish_reason
        return
    frames = list(sse_events(resp.text))
    assert frames and all(name is None for name, _ in frames)
    parsed = [GenerateContentResponse.model_validate(json.loads(d)) for _, d in frames]
    assert parsed[-1].candidates[0].finish_reason is not None
    assert parsed[-1].usage_metadata is not None
    for p in parsed:
        for part in (p.candidates[0].content.parts or []) if p.candidates[0].content else []:
            if part.function_call:
                assert part.function_call.name and isinstance(part.function_call.args, dict)


def provider_of(path: str) -> str:
    if "/v1/messages" in path:
        return "anthropic"
    if "/v1/chat/completions" in path:
        return "openai_chat"
    if "/v1/responses" in path:
        return "openai_responses"
    return "gemini"


CHECKS = {"anthropic": check_anthropic, "openai_chat": check_openai_chat,
          "openai_responses": check_openai_responses, "gemini": check_gemini}


# ---- the test --------------------------------------------------------------------------------

def test_fixtures_present() -> None:
    """Every harness has at least one recorded multi-turn session with a tool result."""
    harnesses = {p.parent.name for p in FIXTURES}
    assert harnesses >= {"claude_code", "codex", "gemini_cli", "qwen_code", "opencode", "pi"}
    for h in harnesses:
        assert any(load(p)["outcome"]["multi_turn"] for p in REPLAY_DIR.glob(f"{h}/*.json")), h


@pytest.mark.parametrize("path", FIXTURES, ids=[f"{p.parent.name}-{p.stem}" for p in FIXTURES])
def test_replay(path: Path, gateway) -> None:
    fixture = load(path)
    sess = gateway.new_session(metadata={"replay": f"{path.parent.name}/{path.stem}"})
    key = sess["key"]
    generations = 0
    providers = [provider_of(r["path"]) for r in fixture["requests"] if r["generation"]]
    for i, req in enumerate(fixture["requests"]):
        url = gateway.url + req["path"].replace(REPLAY_KEY, key)
        headers = {k: v.replace(REPLAY_KEY, key) for k, v in req["headers"].items()}
        data = None
        if req["body"] is not None:
            data = (json.dumps(req["body"]) if req["body_format"] == "json" else req["body"])
            data = data.replace(REPLAY_KEY, key).encode()
        resp = requests.request(req["method"], url, data=data, headers=headers, timeout=120)
        where = f"{path.parent.name}/{path.name} request {i}: {req['method']} {req['path']}"
        if not req["generation"]:  # e.g. Claude Code's HEAD probe: any non-5xx answer will do
            assert resp.status_code < 500, f"{where}: {resp.status_code} {resp.text[:500]}"
            continue
        assert resp.status_code == req["recorded_status"], f"{where}: {resp.status_code} {resp.text[:500]}"
        if resp.status_code != 200:
            continue
        generations += 1
        ctype = resp.headers.get("content-type", "")
        if req["stream"]:
            assert ctype.startswith("text/event-stream"), f"{where}: {ctype}"
        else:
            assert ctype.startswith("application/json"), f"{where}: {ctype}"
        try:
            CHECKS[provider_of(req["path"])](resp, bool(req["stream"]))
        except Exception as exc:
            raise AssertionError(f"{where}: bad response: {exc!r}\n{resp.text[:3000]}") from exc

    calls = gateway.calls(sess["session_id"])
    generation_calls = [c for c in calls if c.get("kind", "generation") == "generation"]
    assert len(generation_calls) == generations, [(c["provider"], c["status"]) for c in calls]
    for c in generation_calls:
        assert c["status"] == "ok", c.get("error")
        assert c["provider"] == providers[0] if len(set(providers)) == 1 else c["provider"] in providers
        assert c["prompt_token_ids"] and c["completion_token_ids"]
    if fixture["outcome"]["multi_turn"]:
        assert any(m.get("role") == "tool" for c in generation_calls for m in c["messages"])
        # The final answer's prompt extends the tool-calling turn token for token (prefix
        # property), whatever thinking/reasoning items the CLI echoed back.  Side calls (e.g.
        # opencode's title request) come first and are not part of this chain.
        prev, last = generation_calls[-2], generation_calls[-1]
        head = prev["prompt_token_ids"] + prev["completion_token_ids"]
        assert last["prompt_token_ids"][: len(head)] == head, "prefix property broken"


def json_schema_requests() -> list[tuple[Path, int]]:
    """Recorded non-streaming Gemini generation requests that ask for JSON with a schema."""
    out = []
    for path in FIXTURES:
        for i, req in enumerate(load(path)["requests"]):
            body = req["body"] if isinstance(req["body"], dict) else {}
            gc = body.get("generationConfig") or {}
            if req["generation"] and not req["stream"] and provider_of(req["path"]) == "gemini" \
                    and (gc.get("responseJsonSchema") or gc.get("responseSchema")):
                out.append((path, i))
    return out


@pytest.mark.parametrize("path,index", json_schema_requests(),
                         ids=[f"{p.parent.name}-{p.stem}-{i}" for p, i in json_schema_requests()])
def test_json_schema_answer_matches_schema(path: Path, index: int, gateway) -> None:
    """A request with a JSON response schema (Gemini CLI's router call) gets a JSON object back."""
    req = load(path)["requests"][index]
    sess = gateway.new_session()
    url = gateway.url + req["path"].replace(REPLAY_KEY, sess["key"])
    headers = {k: v.replace(REPLAY_KEY, sess["key"]) for k, v in req["headers"].items()}
    resp = requests.post(url, data=json.dumps(req["body"]).replace(REPLAY_KEY, sess["key"]),
                         headers=headers, timeout=60)
    assert resp.status_code == 200, resp.text
    data = resp.json()
    text = "".join(p.get("text", "") for p in data["candidates"][0]["content"]["parts"]
                   if not p.get("thought"))
    value = json.loads(text)
    schema = req["body"]["generationConfig"].get("responseJsonSchema") or \
        req["body"]["generationConfig"].get("responseSchema")
    assert isinstance(value, dict), text
    assert set(schema.get("required", [])) <= set(value), text
