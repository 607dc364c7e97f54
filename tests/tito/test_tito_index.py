"""The session index (tito/index.py) picks exactly what matching.find_parent picks over the whole
session, against the suite's real Redis, on generated sessions: forks, retries, edited system
prompts, changed tools, failed calls and calls without ids, records stored between lookups
(the index reads only the new ones), and by other writers than the index's process.

And what it is for: a lookup reads the records stored since the last one, not the session."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polar_mq.model import CaptureRecord, new_id
from polar_mq.proxy_app.tito.index import HEAD, SessionIndex
from polar_mq.proxy_app.tito.matching import find_parent
from polar_mq.store.core import GatewayStore

TOOLS_A = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
TOOLS_B = TOOLS_A + [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]
SYSTEMS = ["You are a coding agent. " * 8, "You are a coding agent. " * 8 + "Today is Tuesday."]


@pytest.fixture()
def store(redis_url: str) -> GatewayStore:
    return GatewayStore(redis.Redis.from_url(redis_url))


def _reply(draw: Any, k: int) -> dict[str, Any]:
    kind = draw(st.sampled_from(["tool", "text", "think"]))
    if kind == "tool":
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{k}", "type": "function",
             "function": {"name": "bash", "arguments": json.dumps({"command": f"ls {k % 3}"})}}]}
    if kind == "think":
        return {"role": "assistant", "content": f"step {k % 4}", "reasoning": f"thinking {k % 2}"}
    return {"role": "assistant", "content": f"step {k % 4}"}


def _echo(draw: Any, reply: dict[str, Any]) -> dict[str, Any]:
    """The client's copy of a reply: as sent, re-serialised arguments, reasoning dropped."""
    echo = json.loads(json.dumps(reply))
    way = draw(st.sampled_from(["same", "spaced", "no-reasoning"]))
    if way == "spaced" and echo.get("tool_calls"):
        fn = echo["tool_calls"][0]["function"]
        fn["arguments"] = json.dumps(json.loads(fn["arguments"]), indent=1)
    if way == "no-reasoning":
        echo.pop("reasoning", None)
    return {k: v for k, v in echo.items() if v is not None}


def _next_turn(draw: Any, reply: dict[str, Any], k: int) -> dict[str, Any]:
    if reply.get("tool_calls"):
        return {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": f"out {k % 3}"}
    return {"role": "user", "content": f"next {k % 3}"}


def _opening(draw: Any) -> list[dict[str, Any]]:
    systems = draw(st.integers(0, HEAD))  # past HEAD - 2 system messages: find_parent's own path
    return ([{"role": "system", "content": draw(st.sampled_from(SYSTEMS))} for _ in range(systems)]
            + [{"role": "user", "content": draw(st.sampled_from(["fix the bug", "write a test"]))}])


def _record(draw: Any, session_id: str, messages: list[dict[str, Any]], k: int, t: float) -> CaptureRecord:
    reply = _reply(draw, k)
    outcome = draw(st.sampled_from(["ok"] * 6 + ["error", "no-ids"]))
    return CaptureRecord(
        session_id=session_id, provider="openai_chat", call_id=new_id("call"), started_at=t,
        messages=messages, tools=draw(st.sampled_from([TOOLS_A] * 4 + [TOOLS_B])),
        response_message=None if outcome == "error" else reply,
        status="error" if outcome == "error" else "ok",
        prompt_token_ids=[] if outcome == "no-ids" else list(range(3, 3 + 10 * len(messages))),
        completion_token_ids=[] if outcome == "no-ids" else [7, 8, 9], kind="generation")


def _request(draw: Any, records: list[CaptureRecord]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    way = draw(st.sampled_from(["extend"] * 5 + ["retry", "edit", "new", "short"]))
    if not records or way == "new":
        return _opening(draw), TOOLS_A
    rec = draw(st.sampled_from(records))
    msgs = [json.loads(json.dumps(m)) for m in rec.messages]
    if way == "retry":
        return msgs, rec.tools
    if way == "short":
        return msgs[:-1] or msgs, rec.tools
    if way == "edit" and any(m["role"] == "system" for m in msgs):
        i = next(i for i, m in enumerate(msgs) if m["role"] == "system")
        msgs[i] = {"role": "system", "content": SYSTEMS[1] if msgs[i]["content"] == SYSTEMS[0] else SYSTEMS[0]}
    reply = rec.response_message or _reply(draw, 99)
    tools = rec.tools if draw(st.booleans()) else draw(st.sampled_from([TOOLS_A, TOOLS_B]))
    return msgs + [_echo(draw, reply), _next_turn(draw, reply, len(msgs))], tools


def _same(a: Any, b: Any) -> tuple[Any, ...]:
    return (a.parent.call_id if a.parent else None, a.reason, a.retry_of, a.lineage), \
           (b.parent.call_id if b.parent else None, b.reason, b.retry_of, b.lineage)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_the_index_picks_what_find_parent_picks(store: GatewayStore, data: Any) -> None:
    draw = data.draw
    session_id = new_id("sess")
    index = SessionIndex(store)
    records: list[CaptureRecord] = []
    t = time.time()
    for step in range(draw(st.integers(1, 14))):
        messages, tools = _request(draw, records)
        got = index.find_parent(session_id, messages, tools)
        want = find_parent(messages, tools, store.calls(session_id))
        mine, theirs = _same(got, want)
        assert mine == theirs, (step, messages)
        if got.parent is not None:
            assert got.parent.to_dict() == want.parent.to_dict()  # the whole record, read from Redis
        # record this call (sometimes a few at once, as other processes would)
        for _ in range(draw(st.integers(0, 2))):
            t += draw(st.sampled_from([0.0, 0.5, 1.0]))  # equal started_at: stored order decides
            rec = _record(draw, session_id, messages, len(records), t)
            store.append_call(rec)
            records.append(rec)


def test_a_lookup_reads_only_the_records_stored_since_the_last(store: GatewayStore, monkeypatch) -> None:
    session_id = new_id("sess")
    index = SessionIndex(store)
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEMS[0]}, {"role": "user", "content": "go"}]
    read: list[int] = []  # blobs each lookup read from the real Redis
    since = store.call_blobs_since

    def counted(sid: str, start: int) -> tuple[int, list[bytes]]:
        length, blobs = since(sid, start)
        read.append(len(blobs))
        return length, blobs

    monkeypatch.setattr(store, "call_blobs_since", counted)
    monkeypatch.setattr(store, "calls", lambda sid: pytest.fail("the whole session was read"))
    for k in range(30):
        match = index.find_parent(session_id, messages, TOOLS_A)
        assert match.reason == ("first_call" if k == 0 else "continued")
        reply = {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{k}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]}
        store.append_call(CaptureRecord(session_id=session_id, provider="openai_chat", messages=list(messages),
                                        tools=TOOLS_A, response_message=reply, prompt_token_ids=[1, 2],
                                        completion_token_ids=[3]))
        messages = messages + [reply, {"role": "tool", "tool_call_id": f"call_{k}", "content": f"out {k}"}]
    assert read == [0] + [1] * 29  # one new record per lookup


def test_a_collected_session_is_read_again(store: GatewayStore) -> None:
    session_id = new_id("sess")
    index = SessionIndex(store)
    msgs = [{"role": "user", "content": "go"}]
    reply = {"role": "assistant", "content": "done"}
    for _ in range(3):
        store.append_call(CaptureRecord(session_id=session_id, provider="openai_chat", messages=msgs,
                                        response_message=reply, prompt_token_ids=[1], completion_token_ids=[2]))
    nxt = msgs + [reply, {"role": "user", "content": "more"}]
    assert index.find_parent(session_id, nxt, None).reason == "continued"
    store.r.delete(store.keys.calls(session_id), store.keys.call_chunks(session_id))
    assert index.find_parent(session_id, nxt, None).reason == "first_call"
    rec = CaptureRecord(session_id=session_id, provider="openai_chat", messages=msgs, response_message=reply,
                        prompt_token_ids=[1], completion_token_ids=[2])
    store.append_call(rec)
    match = index.find_parent(session_id, nxt, None)
    assert match.reason == "continued" and match.parent is not None and match.parent.call_id == rec.call_id
