"""One tool round trip per provider API with the official SDKs (the demo's round trips), checked
end to end: the sampled ids of turn 1 re-appear verbatim in the prompt of turn 2, so the session
merges into one trace. Key order, tool-argument JSON and history conversion all matter here."""

from __future__ import annotations

import pytest
import requests

from polar_mq.cli.demo import ROUND_TRIPS


@pytest.mark.parametrize("provider,round_trip", ROUND_TRIPS, ids=[p for p, _ in ROUND_TRIPS])
def test_round_trip_keeps_the_prefix_property(gateway, provider, round_trip):
    session = gateway.new_session()
    round_trip(session)
    calls = gateway.calls(session["session_id"])
    assert [c["provider"] for c in calls] == [provider, provider]
    assert [c["finish_reason"] for c in calls] == ["tool_calls", "stop"]
    first, second = calls
    assert second["stream"] is True or provider == "openai_chat"
    head = first["prompt_token_ids"] + first["completion_token_ids"]
    assert second["prompt_token_ids"][: len(head)] == head
    for c in calls:
        assert len(c["completion_logprobs"]) == len(c["completion_token_ids"]) > 0
    traj = requests.get(f"{gateway.url}/sessions/{session['session_id']}/trajectory", headers=gateway.admin_headers,
                        params={"builder": "prefix_merging"}, timeout=10).json()
    assert traj["stats"]["traces"] == 1 and traj["stats"]["delivered_fraction"] == 1.0
    trace = traj["traces"][0]
    assert trace["prompt_ids"] + trace["response_ids"] == second["prompt_token_ids"] + second["completion_token_ids"]
    assert sum(trace["loss_mask"]) == len(first["completion_token_ids"]) + len(second["completion_token_ids"])


@pytest.fixture(scope="module")
def eager_ping_gateway(log_dir, redis_url, model_server):
    """A gateway that starts streaming (with keep-alive pings) almost at once."""
    from tests.support.servers import GatewayHandle, start_gateway, stop

    server = start_gateway(log_dir, redis_url, [model_server], name="gw-eager-ping",
                           env={"POLAR_FIRST_BYTE_WAIT": "0.1", "POLAR_PING_INTERVAL": "0.2"})
    yield GatewayHandle(url=server.url, upstream_url=model_server, redis_url=redis_url, server=server)
    stop(server.proc)


def _slow_stream(provider: str, s: dict) -> str:
    prompt = "answer slowly polar:sleep=1 polar:notool"
    if provider == "openai_chat":
        import openai
        c = openai.OpenAI(base_url=s["base_urls"]["openai"], api_key=s["key"], max_retries=0)
        return "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
            model="m", stream=True, messages=[{"role": "user", "content": prompt}]) if ch.choices)
    if provider == "openai_responses":
        import openai
        c = openai.OpenAI(base_url=s["base_urls"]["openai"], api_key=s["key"], max_retries=0)
        with c.responses.stream(model="m", input=prompt) as stream:
            return stream.get_final_response().output_text
    if provider == "anthropic":
        import anthropic
        c = anthropic.Anthropic(base_url=s["base_urls"]["anthropic"], api_key=s["key"], max_retries=0)
        with c.messages.stream(model="m", max_tokens=200, messages=[{"role": "user", "content": prompt}]) as st:
            return "".join(b.text for b in st.get_final_message().content if b.type == "text")
    from google import genai
    from google.genai import types
    c = genai.Client(api_key=s["key"], http_options=types.HttpOptions(base_url=s["base_urls"]["gemini"]))
    return "".join(ch.text or "" for ch in c.models.generate_content_stream(model="m", contents=prompt))


@pytest.mark.parametrize("provider", [p for p, _ in ROUND_TRIPS])
def test_sdk_streams_survive_keepalive_pings(eager_ping_gateway, provider):
    """Pings flow before the first event while the upstream works; every official SDK must
    still parse the stream and get exactly the recorded text."""
    s = eager_ping_gateway.new_session()
    text = _slow_stream(provider, s)
    rec = eager_ping_gateway.calls(s["session_id"])[0]
    assert rec["latency_ms"] > 900 and rec["stream"] is True
    assert text and text == rec["response_message"]["content"]
