"""A finished 30-call Claude-Code-shaped session (bench/bench_storage.py) in a real Redis: its
gateway records plus its stored result trajectory stay within 3x its information for both
builders, and every reader (PipelineStore, the API's results, the groups API as msgpack and JSON,
the viewer's session page, through the real API process and polar_mq.client) gets exactly what a
full-ids value gives: the same answer read from the compact layout and from the whole msgpack
value it replaced (store/trajectory_codec.py)."""

from __future__ import annotations

import time
import uuid

import msgpack
import pytest
import redis
import requests

from polar_mq import states
from polar_mq.client import Client
from polar_mq.merge.registry import build
from polar_mq.store.core import GatewayStore, Keys, connect, pack
from polar_mq.store.pipeline import PipelineStore
from polar_mq.taskspec import parse_task
from tests.api.test_api import db_url, start_api, walk
from tests.store.test_storage import _bench
from tests.support.servers import AUTH, stop

BUILDERS = ("per_request", "prefix_merging")


@pytest.fixture(scope="module")
def bench():
    return _bench()


@pytest.fixture(scope="module")
def records(bench):
    return bench.claude_code_session(30, session_id=f"traj-{uuid.uuid4().hex[:8]}")


def memory(r: redis.Redis, key: str) -> int:
    return int(r.memory_usage(key, samples=0) or 0)


def test_finished_session_within_3x_information_and_exact(redis_url, records, bench):
    r = redis.Redis.from_url(redis_url)
    gw = GatewayStore(r)
    for rec in records:
        gw.append_call(rec)
    sid = records[0].session_id
    gateway_bytes = memory(r, gw.keys.calls(sid)) + memory(r, gw.keys.call_chunks(sid))
    info = bench.information_bytes(records)
    store = PipelineStore(r)
    for builder in BUILDERS:
        traj = build(builder, records, session_id=f"{sid}-{builder}")
        whole = traj.to_dict()
        store.save_trajectory(traj)
        key = store.keys.trajectory(traj.session_id, "result")
        assert gateway_bytes + memory(r, key) <= 3 * info, (builder, gateway_bytes, memory(r, key), info)
        assert len(pack(whole)) > 4 * len(r.get(key))  # what the compact value saves
        assert store.get_trajectory(traj.session_id).to_dict() == whole
        assert store.trajectory_blobs([traj.session_id]) == [pack(whole)]
    # per_request: one trace per call, each with that call's full prompt ids as captured
    back = store.get_trajectory(f"{sid}-per_request")
    assert [t.prompt_ids for t in back.traces] == [list(rec.prompt_token_ids) for rec in records]
    assert [t.response_ids for t in back.traces] == [list(rec.completion_token_ids) for rec in records]


@pytest.fixture(scope="module")
def api(log_dir, redis_url):
    url = db_url(redis_url, 13)
    redis.Redis.from_url(url).flushdb()
    server = start_api(log_dir, url, name="api-trajstore")
    yield server.url, url
    stop(server.proc)


def read_all(api_url: str, task_id: str, sids: list[str], lease: float) -> dict:
    """What each reader answers for the task's trajectories."""
    client = Client(api_url)
    groups = client.next_groups(limit=1, wait=10, lease=lease)  # msgpack
    assert [g["task_id"] for g in groups] == [task_id]
    time.sleep(lease)
    json_groups = client.next_groups(limit=1, wait=10, lease=lease, msgpack_body=False)
    time.sleep(lease)
    pages = [requests.get(f"{api_url}/ui/api/sessions/{sid}", headers=AUTH, timeout=60) for sid in sids]
    assert all(p.status_code == 200 for p in pages), [p.text[:300] for p in pages]
    by_sid = lambda ts: sorted(ts, key=lambda t: t["session_id"])  # noqa: E731
    return {"results": by_sid(client.results(task_id)["trajectories"]),
            "groups_msgpack": by_sid(groups[0]["trajectories"]),
            "groups_json": by_sid(json_groups[0]["trajectories"]),
            "viewer": [p.json() for p in pages]}


def test_every_reader_gets_the_full_prompt_ids(api, records):
    api_url, url = api
    task_id = f"trajstore-{uuid.uuid4().hex[:6]}"
    store = PipelineStore(connect(url))
    sids, _ = store.create_task(parse_task({
        "task_id": task_id, "instruction": "x", "num_samples": 2,
        "agent": {"harness": "shell", "options": {"command": "true"}}, "runtime": {"backend": "local"}}))
    trajs = {}
    for sid, builder in zip(sids, BUILDERS):
        traj = build(builder, records, session_id=sid, task_id=task_id)
        trajs[sid] = traj
        store.save_trajectory(traj)
        walk(store, sid)
    compact = read_all(api_url, task_id, sids, lease=0.5)
    # The same trajectories as whole msgpack values (the layout before): every answer is the same.
    keys = Keys()
    r = redis.Redis.from_url(url)
    for sid, traj in trajs.items():
        r.set(keys.trajectory(sid, "result"), pack(traj.to_dict()))
    whole = read_all(api_url, task_id, sids, lease=0.5)
    assert compact == whole
    per_request = next(t for t in compact["results"] if t["builder"] == "per_request")
    assert [t["prompt_ids"] for t in per_request["traces"]] == [list(rec.prompt_token_ids) for rec in records]
    merged = next(t for t in compact["groups_msgpack"] if t["builder"] == "prefix_merging")
    assert msgpack.packb(merged, use_bin_type=True) == pack(trajs[merged["session_id"]].to_dict())
    assert states.COMPLETED == compact["results"][0]["status"]
