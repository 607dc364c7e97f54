"""Token-in continuation through the gateway, against the stand-in model server.

The stand-in's template renders an assistant turn exactly as it samples it, so here the token-in
prompt of a continued call must be *identical* to the prompt the messages path renders: that
checks the tail rendering (new messages + generation prompt, cut after the parent's end-of-turn)
token for token. Matching is checked on forks, retries, compaction, sub-agents, edited history and
changed tools.
"""

from __future__ import annotations

import json

import openai
import pytest
import requests

from tests.support.servers import AUTH
from polar_mq.dev.model_server.tokenizer import load_tokenizer
from tests.support.tito_records import PROVIDERS, SESSIONS, WRITE_SCHEMA, qwen3_tokenizer_dir, start_qwen3_stack

TOOLS = [{"type": "function", "function": {"name": "write", "parameters": WRITE_SCHEMA}}]


@pytest.fixture(scope="module")
def tito_gateway(log_dir, redis_url, model_server):
    from tests.support.servers import GatewayHandle, start_gateway, stop

    server = start_gateway(log_dir, redis_url, [model_server], "--tito", "on",
                           "--tokenizer", load_tokenizer().path, name="gw-tito")
    yield GatewayHandle(url=server.url, upstream_url=model_server, redis_url=redis_url, server=server)
    stop(server.proc)


def _trajectory(gw, sid: str) -> dict:
    return requests.get(f"{gw.url}/sessions/{sid}/trajectory", headers=AUTH, params={"builder": "prefix_merging"},
                        timeout=10).json()


def test_health_says_tito(tito_gateway, gateway):
    on = requests.get(f"{tito_gateway.url}/health", timeout=10).json()["tito"]
    assert on["mode"] == "on" and on["active"] is True and on["endpoint"] == "/v1/completions"
    auto = requests.get(f"{gateway.url}/health", timeout=10).json()["tito"]
    assert auto["mode"] == "auto" and auto["active"] is False and "tokenizer" in auto["reason"]
    assert requests.get(f"{tito_gateway.url}/health", timeout=10).json()["upstreams"][0]["token_in"] is True


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("provider", PROVIDERS)
def test_session_continues_by_tokens(tito_gateway, gateway, provider, stream):
    """Each API, plain and streaming: calls 2..4 are continued from the recorded ids, their
    prompts equal the messages path's, the client sees the same answers, one trace."""
    on, off = tito_gateway.new_session(), gateway.new_session()
    seen_on = SESSIONS[provider](on, stream)
    seen_off = SESSIONS[provider](off, stream)
    assert seen_on == seen_off
    assert [k for k, *_ in seen_on] == ["tool", "text", "tool", "text"]
    calls, plain = tito_gateway.calls(on["session_id"]), gateway.calls(off["session_id"])
    assert [c["tito"] for c in calls] == [False, True, True, True]
    assert [c["tito_reason"] for c in calls] == ["first_call", "continued", "continued", "continued"]
    assert [c["parent_call_id"] for c in calls] == [None] + [c["call_id"] for c in calls[:-1]]
    assert all(c["tito"] is False and c["parent_call_id"] is None for c in plain)
    for prev, cur, ref in zip(calls, calls[1:], plain[1:]):
        head = prev["prompt_token_ids"] + prev["completion_token_ids"]
        assert cur["prompt_token_ids"][:len(head)] == head
        assert cur["prompt_token_ids"] == ref["prompt_token_ids"]
        assert cur["completion_token_ids"] == ref["completion_token_ids"]
        assert len(cur["completion_logprobs"]) == len(cur["completion_token_ids"])
        assert cur["finish_reason"] == ref["finish_reason"]
        assert cur["stream"] is stream
        # the whole conversation stays in `messages`, as on the messages path
        assert len(cur["messages"]) == len(ref["messages"])
    traj = _trajectory(tito_gateway, on["session_id"])
    assert traj["stats"]["traces"] == 1 and traj["stats"]["delivered_fraction"] == 1.0
    assert traj["stats"]["tito"] == {"calls": 4, "continued": 3, "not_continued": {"first_call": 1}}


@pytest.fixture(scope="module")
def qwen3(log_dir, redis_url, tmp_path_factory):
    from tests.support.servers import stop

    ms, on, off = start_qwen3_stack(log_dir, redis_url, qwen3_tokenizer_dir(tmp_path_factory.mktemp("tok")))
    yield on, off
    for proc in (on.server.proc, off.server.proc, ms.proc):
        stop(proc)


@pytest.mark.parametrize("provider,stream", [("openai_chat", False), ("openai_responses", True),
                                             ("anthropic", False), ("gemini", True)])
def test_asymmetric_template_breaks_without_tito(qwen3, provider, stream):
    """A template whose generation prompt is not how history renders (Qwen3's empty think block):
    with tito off every continuation re-renders the previous answer and the session breaks into
    several traces; with tito on it is one trace, and the client sees the same answers."""
    on, off = qwen3
    s_on, s_off = on.new_session(), off.new_session()
    assert SESSIONS[provider](s_on, stream) == SESSIONS[provider](s_off, stream)
    calls, plain = on.calls(s_on["session_id"]), off.calls(s_off["session_id"])
    assert [c["tito"] for c in calls] == [False, True, True, True]
    for prev, cur in zip(plain, plain[1:]):
        head = prev["prompt_token_ids"] + prev["completion_token_ids"]
        assert cur["prompt_token_ids"][:len(head)] != head
    assert _trajectory(on, s_on["session_id"])["stats"]["traces"] == 1
    stats = _trajectory(off, s_off["session_id"])["stats"]
    assert stats["traces"] == 4 and stats["breaks"] == 3, stats


def _chat(s, msgs, tools=TOOLS, **kw):
    c = openai.OpenAI(base_url=s["base_urls"]["openai"], api_key=s["key"], max_retries=0)
    return c.chat.completions.create(model="m", messages=msgs, tools=tools, **kw).choices[0].message


def _first_turn(s, ask="Write hello into polar.txt"):
    msgs = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": ask}]
    msg = _chat(s, msgs)
    msgs.append({"role": "assistant", "content": msg.content,
                 "tool_calls": [t.model_dump(exclude_none=True) for t in msg.tool_calls]})
    return msgs, msg.tool_calls[0].id


def test_forks_retries_and_lineage(tito_gateway):
    s = tito_gateway.new_session()
    msgs, call_id = _first_turn(s)
    a = msgs + [{"role": "tool", "tool_call_id": call_id, "content": "ok"}]
    b = msgs + [{"role": "tool", "tool_call_id": call_id, "content": "permission denied"}]
    _chat(s, a)
    _chat(s, b)  # a fork: another continuation of call 1
    _chat(s, a)  # a retry of the first continuation
    calls = tito_gateway.calls(s["session_id"])
    root = calls[0]["call_id"]
    assert [c["tito"] for c in calls] == [False, True, True, True]
    assert [c["parent_call_id"] for c in calls] == [None, root, root, root]
    assert calls[3]["prompt_token_ids"] == calls[1]["prompt_token_ids"]
    assert any(f"same request as call {calls[1]['call_id']}" in n for n in calls[3]["notes"])
    traj = _trajectory(tito_gateway, s["session_id"])
    origins = sorted((t["metadata"].get("break"), len(t["call_ids"])) for t in traj["traces"])
    assert traj["stats"]["retries"] == 1 and traj["stats"]["traces"] == 3, origins
    assert traj["stats"]["tito"]["continued"] == 3


def test_no_match_starts_fresh_and_says_why(tito_gateway):
    s = tito_gateway.new_session()
    msgs, call_id = _first_turn(s)
    after = msgs + [{"role": "tool", "tool_call_id": call_id, "content": "ok"}]
    _chat(s, after)
    # a harness that edits history: a per-turn header line in the system prompt
    edited = [{"role": "system", "content": "You are a coding agent. (turn 2)"}] + after[1:]
    _chat(s, edited)
    # ... or rewrites the first request; an edit after a recorded reply still continues it
    _chat(s, after[:2] + [{"role": "user", "content": "Be brief."}] + after[2:])
    _chat(s, after[:3] + [{"role": "tool", "tool_call_id": call_id, "content": "ok (edited)"}])
    # context compaction: the history replaced by a summary
    _chat(s, [msgs[0], {"role": "user", "content": "Summary: wrote polar.txt. Continue."}])
    # a sub-agent: its own conversation in the same session
    _chat(s, [{"role": "system", "content": "You are a search sub-agent."},
              {"role": "user", "content": "find files"}], tools=None)
    # same history, other tools: the prompt's tool block would change
    _chat(s, after, tools=TOOLS + [{"type": "function", "function": {"name": "read", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}}}}}])
    calls = tito_gateway.calls(s["session_id"])
    assert [c["tito_reason"] for c in calls] == [
        "first_call", "continued", "edited_history", "edited_history", "continued",
        "new_conversation", "new_conversation", "tools_changed"]
    assert [c["tito"] for c in calls] == [False, True, False, False, True, False, False, False]
    assert calls[4]["parent_call_id"] == calls[0]["call_id"]
    assert calls[7]["parent_call_id"] == calls[0]["call_id"]  # the lineage, not continued by tokens
    stats = _trajectory(tito_gateway, s["session_id"])["stats"]["tito"]
    assert stats == {"calls": 8, "continued": 2, "not_continued": {
        "edited_history": 2, "first_call": 1, "new_conversation": 2, "tools_changed": 1}}


def test_context_length_of_a_continued_prompt(log_dir, redis_url):
    """A continued prompt over the window gets the provider's context error, as on the messages
    path, and the failed call is recorded."""
    from tests.support.servers import start_gateway, start_model_server, stop

    ms = start_model_server(log_dir, "--max-model-len", "700", name="ms-small")
    gw = start_gateway(log_dir, redis_url, [ms.url], "--tito", "on", "--tokenizer",
                       load_tokenizer().path, name="gw-tito-small")
    try:
        s = requests.post(f"{gw.url}/sessions", headers=AUTH, json={}, timeout=10).json()
        msgs, call_id = _first_turn(s)
        long = msgs + [{"role": "tool", "tool_call_id": call_id, "content": "word " * 800}]
        with pytest.raises(openai.BadRequestError) as err:
            _chat(s, long)
        assert "context" in str(err.value).lower()
        calls = requests.get(f"{gw.url}/sessions/{s['session_id']}/calls", headers=AUTH, timeout=10).json()["calls"]
        assert calls[-1]["tito"] is True and calls[-1]["status"] == "error"
        assert "context_length" in calls[-1]["error"]
    finally:
        stop(gw.proc)
        stop(ms.proc)
