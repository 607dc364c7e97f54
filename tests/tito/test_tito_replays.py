"""The real CLI captures (tests/replays) replayed through a gateway with token-in continuation on,
in front of the stand-in serving a Qwen3-style template (which never round-trips).

Every fixture's answers still parse with the official SDK types / follow the provider's event
sequence, and the call that answers the tool result is continued from the recorded ids of the
tool-calling call: the harnesses' echoed histories (re-serialised tool arguments, thinking blocks
with our signatures, encrypted reasoning, thought signatures, Claude Code's cache_control marks)
are recognised as the gateway's own earlier replies.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests

from tests.adapters.test_replays import CHECKS, FIXTURES, REPLAY_KEY, load, provider_of
from tests.support.tito_records import qwen3_tokenizer_dir, start_qwen3_stack


@pytest.fixture(scope="module")
def tito_gateway(log_dir, redis_url, tmp_path_factory):
    """tito on in front of the stand-in serving the Qwen3-style template (history never renders
    as sampled: without tito every continuation would break)."""
    from tests.support.servers import stop

    ms, on, off = start_qwen3_stack(log_dir, redis_url, qwen3_tokenizer_dir(tmp_path_factory.mktemp("tok")))
    yield on
    for proc in (on.server.proc, off.server.proc, ms.proc):
        stop(proc)


def replay(gw, path: Path) -> list[dict]:
    fixture = load(path)
    sess = gw.new_session(metadata={"replay": f"{path.parent.name}/{path.stem}"})
    key = sess["key"]
    for i, req in enumerate(fixture["requests"]):
        data = None
        if req["body"] is not None:
            data = (json.dumps(req["body"]) if req["body_format"] == "json" else req["body"])
            data = data.replace(REPLAY_KEY, key).encode()
        resp = requests.request(req["method"], gw.url + req["path"].replace(REPLAY_KEY, key), data=data,
                                headers={k: v.replace(REPLAY_KEY, key) for k, v in req["headers"].items()},
                                timeout=120)
        if not req["generation"]:
            assert resp.status_code < 500
            continue
        assert resp.status_code == req["recorded_status"], resp.text[:500]
        if resp.status_code == 200:
            CHECKS[provider_of(req["path"])](resp, bool(req["stream"]))
    return [c for c in gw.calls(sess["session_id"]) if c.get("kind", "generation") == "generation"]


@pytest.mark.slow
@pytest.mark.parametrize("path", FIXTURES, ids=[f"{p.parent.name}-{p.stem}" for p in FIXTURES])
def test_replay_with_tito(path: Path, tito_gateway) -> None:
    calls = replay(tito_gateway, path)
    assert all("tito" in c and "parent_call_id" in c and c["tito_reason"] for c in calls)
    assert all(c["status"] == "ok" and c["completion_token_ids"] for c in calls)
    if not load(path)["outcome"]["multi_turn"]:
        return
    prev, last = calls[-2], calls[-1]
    assert (last["tito"], last["tito_reason"], last["parent_call_id"]) == (True, "continued", prev["call_id"])
    head = prev["prompt_token_ids"] + prev["completion_token_ids"]
    assert last["prompt_token_ids"][:len(head)] == head
    traj = requests.get(f"{tito_gateway.url}/sessions/{last['session_id']}/trajectory", headers=tito_gateway.admin_headers,
                        params={"builder": "prefix_merging"}, timeout=30).json()
    assert traj["stats"]["delivered_fraction"] == 1.0 and traj["stats"]["breaks"] == 0
