"""Token-in continuation against real vLLM, with a template that does not round-trip.

The tiny model is served with a Qwen3-style template (scripts/build_tiny_qwen3.py): every
generation prompt ends in an empty `<think>\\n\\n</think>\\n\\n`, history renders without it. On the
messages path (`--tito off`) each call's prompt therefore re-renders the previous answer and the
session breaks into several traces; with token-in continuation it is one trace, every record's
completion ids are vLLM's own greedy continuation of its prompt ids, and the client sees the same
answers either way — for each provider API, plain and streaming.
"""

from __future__ import annotations

import pytest
import requests

from tests.support.tito_records import PROVIDERS, SESSIONS

SERVED = "tiny"
ARGS = {"path": "polar.txt", "content": "hello from polar"}
FINAL = "Done. I wrote polar.txt."
EXPECTED = [("tool", "write", ARGS), ("text", FINAL), ("tool", "write", ARGS), ("text", FINAL)]


@pytest.fixture(scope="module")
def tito_gateways(log_dir, redis_url, vllm_qwen3):
    """(auto with the tokenizer: token-in detected, off: the messages path)."""
    from tests.vllm.conftest import GatewayHandle, start_gateway, stop

    url, tokenizer = vllm_qwen3
    auto = start_gateway(log_dir, redis_url, [url], "--tokenizer", str(tokenizer), name="gw-tito-vllm")
    off = start_gateway(log_dir, redis_url, [url], "--tito", "off", name="gw-notito-vllm")
    yield (GatewayHandle(url=auto.url, upstream_url=url, redis_url=redis_url, server=auto),
           GatewayHandle(url=off.url, upstream_url=url, redis_url=redis_url, server=off))
    stop(auto.proc)
    stop(off.proc)


def _trajectory(gw, sid: str) -> dict:
    return requests.get(f"{gw.url}/sessions/{sid}/trajectory", headers=gw.admin_headers, params={"builder": "prefix_merging"},
                        timeout=30).json()


def test_auto_detects_token_in(tito_gateways):
    auto, off = tito_gateways
    health = requests.get(f"{auto.url}/health", timeout=30).json()
    assert health["tito"]["mode"] == "auto" and health["tito"]["active"] is True
    assert health["upstreams"][0]["token_in"] is True
    assert requests.get(f"{off.url}/health", timeout=30).json()["tito"]["active"] is False


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("provider", PROVIDERS)
def test_one_trace_with_tito_breaks_without(tito_gateways, provider, stream):
    auto, off = tito_gateways
    on_s, off_s = auto.new_session(), off.new_session()
    seen_on = SESSIONS[provider](on_s, stream)
    seen_off = SESSIONS[provider](off_s, stream)
    assert seen_on == seen_off == EXPECTED

    calls = auto.calls(on_s["session_id"])
    assert [c["tito"] for c in calls] == [False, True, True, True]
    assert [c["parent_call_id"] for c in calls] == [None] + [c["call_id"] for c in calls[:-1]]
    for prev, cur in zip(calls, calls[1:]):
        head = prev["prompt_token_ids"] + prev["completion_token_ids"]
        assert cur["prompt_token_ids"][:len(head)] == head
    on_traj = _trajectory(auto, on_s["session_id"])
    assert on_traj["stats"]["traces"] == 1 and on_traj["stats"]["breaks"] == 0
    assert on_traj["stats"]["delivered_fraction"] == 1.0

    plain = off.calls(off_s["session_id"])
    for prev, cur in zip(plain, plain[1:]):  # the template re-rendered the answer without <think>
        head = prev["prompt_token_ids"] + prev["completion_token_ids"]
        assert cur["prompt_token_ids"][:len(head)] != head
    off_traj = _trajectory(off, off_s["session_id"])
    assert off_traj["stats"]["breaks"] >= 1 and off_traj["stats"]["traces"] > 1

    # every record's sampled ids are vLLM's own greedy continuation of the recorded prompt ids
    for c in calls:
        r = requests.post(f"{auto.upstream_url}/v1/completions", timeout=120, json={
            "model": SERVED, "prompt": c["prompt_token_ids"], "temperature": 0,
            "max_tokens": len(c["completion_token_ids"]), "return_token_ids": True, "logprobs": 0})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["token_ids"] == c["completion_token_ids"]
        assert choice["logprobs"]["token_logprobs"] == pytest.approx(c["completion_logprobs"], abs=1e-4)
