"""Versions per token (CONTRACT "Agent lineage and versions per token"): records and traces carry
`policy_versions` = [[token_offset, version], ...]; a stream frozen by a weight sync in pause mode
keep and resumed with new weights carries two pairs, split at its first token after the resume;
trainers can drop, mask or keep the older policy's tokens."""

from __future__ import annotations

import threading
import time

import pytest
import requests

from tests.support.servers import AUTH, start_gateway, start_model_server, stop
from polar_mq.store import codec as record_codec
from polar_mq.rl.group_stream import staleness
from polar_mq.merge import build
from polar_mq.merge.synthetic import SessionSim
from polar_mq.model import CaptureRecord, Group
from polar_mq.rl.trainers.samples import samples_from_group
from tests.api.test_api import start_api

tokenizer_mod = pytest.importorskip("polar_mq.dev.model_server.tokenizer")
TOK = tokenizer_mod.load_tokenizer()


def test_the_record_codec_round_trips_policy_versions() -> None:
    rec = CaptureRecord(session_id="s", provider="openai_chat", prompt_token_ids=list(range(600)),
                        completion_token_ids=[5, 6, 7, 8], completion_logprobs=[-0.1] * 4,
                        policy_version=3, policy_versions=[[0, 3], [2, 4]])
    blob, chunks, _ = record_codec.encode(rec)
    back = record_codec.decode(blob, chunks)
    assert back.policy_versions == [[0, 3], [2, 4]]
    assert back.to_dict() == rec.to_dict()
    old = CaptureRecord.from_dict({k: v for k, v in rec.to_dict().items() if k != "policy_versions"})
    assert old.policy_versions == []  # a record stored before the field: read as one pair by builders


def _session() -> list[CaptureRecord]:
    sim = SessionSim(TOK, seed=11, session_id="v")
    conv = sim.conversation()
    recs = [sim.turn(conv) for _ in range(3)]
    for rec in recs:
        rec.policy_version = 1
        rec.policy_versions = [[0, 1]]
    n = len(recs[1].completion_token_ids)
    recs[1].policy_versions = [[0, 1], [n // 2, 2]]  # ran across a resume
    recs[2].policy_version, recs[2].policy_versions = 2, [[0, 2]]
    return recs


def test_traces_shift_the_offsets_over_their_response_tokens() -> None:
    recs = _session()
    merged = build("prefix_merging", recs, session_id="v")
    assert len(merged.traces) == 1
    trace = merged.traces[0]
    start_of = {}
    offset = 0
    for i, rec in enumerate(recs):  # each call's sampled tokens start where the mask turns to 1
        start_of[i] = trace.loss_mask.index(1, offset)
        offset = start_of[i] + len(rec.completion_token_ids)
    n = len(recs[1].completion_token_ids)
    assert trace.policy_versions == [[0, 1], [start_of[1] + n // 2, 2]]
    assert trace.response_ids[start_of[1] + n // 2] == recs[1].completion_token_ids[n // 2]
    per_call = build("per_request", recs, session_id="v")
    assert [t.policy_versions for t in per_call.traces] == [[[0, 1]], [[0, 1], [n // 2, 2]], [[0, 2]]]


def _group(recs: list[CaptureRecord]) -> dict:
    trajs = []
    for i, reward in enumerate((1.0, 0.0)):
        traj = build("prefix_merging", recs, session_id=f"s{i}")
        traj.reward = reward
        trajs.append(traj)
    g = Group(task_id="t", policy_version=2, trajectories=trajs)
    return g.to_dict()


def test_stale_tokens_drop_mask_keep_and_group_staleness_uses_the_oldest_version() -> None:
    recs = _session()
    group = _group(recs)
    kept = samples_from_group(group, stale_tokens="keep")
    masked = samples_from_group(group, stale_tokens="mask")
    dropped = samples_from_group(group, stale_tokens="drop")
    assert kept.oldest_version == 1
    boundary = group["trajectories"][0]["traces"][0]["policy_versions"][1][0]
    assert masked.samples[0].loss_mask[:boundary] == [0] * boundary
    assert masked.samples[0].loss_mask[boundary:] == kept.samples[0].loss_mask[boundary:]
    assert sum(kept.samples[0].loss_mask) > sum(masked.samples[0].loss_mask) > 0
    assert dropped.samples == []
    with pytest.raises(ValueError, match="stale_tokens"):
        samples_from_group(group, stale_tokens="sometimes")
    assert staleness(Group.from_dict(group), 2) == 1  # the group says 2; its oldest token says 1
    assert staleness(Group(task_id="t", policy_version=2), 2) == 0


@pytest.fixture()
def slow_stack(log_dir, redis_url):
    """A stand-in that streams slowly (so a pause lands mid-stream), its gateway and the API, on
    one Redis."""
    model = start_model_server(log_dir, "--token-latency-ms", "15", name="model-slow")
    gw = start_gateway(log_dir, redis_url, [model.url], name="gateway-versions")
    api = start_api(log_dir, redis_url, name="api-versions")
    yield model.url, gw, api.url
    requests.post(f"{api.url}/v1/admin/resume", headers=AUTH, timeout=10)
    for server in (api, gw, model):
        stop(server.proc)


def test_a_stream_across_a_keep_pause_carries_two_versions(slow_stack) -> None:
    model, gw, api = slow_stack
    requests.post(f"{api}/v1/admin/resume", headers=AUTH, json={"policy_version": 7},
                  timeout=10).raise_for_status()
    s = requests.post(f"{gw.url}/sessions", json={}, headers=AUTH, timeout=10).json()
    url = f"{s['base_urls']['openai']}/chat/completions"
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "polar:long polar:notool"}]}
    seen: list[str] = []
    done = threading.Event()

    def read() -> None:
        with requests.post(url, json=body, stream=True, timeout=120) as resp:
            resp.raise_for_status()
            for line in resp.iter_lines():
                if line:
                    seen.append(line.decode())
        done.set()

    reader = threading.Thread(target=read)
    reader.start()
    deadline = time.monotonic() + 30
    while len(seen) < 20 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(seen) >= 20 and not done.is_set(), "the stream should still be running"
    paused = requests.post(f"{api}/v1/admin/pause", headers=AUTH, params={"wait": 0.2, "mode": "keep"},
                           timeout=30).json()
    assert paused["drained"] is False and paused["mode"] == "keep"  # the stream is kept, frozen
    assert paused["upstreams"][model]["is_paused"] is True
    frozen = len(seen)
    time.sleep(0.8)
    assert len(seen) <= frozen + 2 and not done.is_set()  # no tokens while the weights change
    requests.post(f"{api}/v1/admin/resume", headers=AUTH, json={"policy_version": 8},
                  timeout=10).raise_for_status()
    reader.join(60)
    assert done.is_set()
    deadline = time.monotonic() + 10
    calls: list[dict] = []
    while time.monotonic() < deadline:
        calls = requests.get(f"{gw.url}/sessions/{s['session_id']}/calls", headers=AUTH, timeout=10).json()
        calls = calls.get("calls", calls) if isinstance(calls, dict) else calls
        if calls:
            break
        time.sleep(0.1)
    rec = calls[0]
    assert rec["policy_version"] == 7
    pairs = rec["policy_versions"]
    assert len(pairs) == 2 and pairs[0] == [0, 7] and pairs[1][1] == 8, (pairs, rec["notes"], rec["stream"])
    assert 0 < pairs[1][0] < len(rec["completion_token_ids"])
    # every token the client saw before the pause was sampled before it (the first line is the role)
    assert pairs[1][0] >= frozen - 2, (pairs, frozen)
    plain = requests.post(f"{s['base_urls']['openai']}/chat/completions", timeout=60,
                          json={"model": "m", "messages": [{"role": "user", "content": "hi polar:notool"}]})
    plain.raise_for_status()
    calls = requests.get(f"{gw.url}/sessions/{s['session_id']}/calls", headers=AUTH, timeout=10).json()
    calls = calls.get("calls", calls) if isinstance(calls, dict) else calls
    assert calls[-1]["policy_versions"] == [[0, 8]]  # an ordinary call: one pair
