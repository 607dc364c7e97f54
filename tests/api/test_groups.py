"""Groups for trainers through the real API process, real Celery worker pools and real Redis:
a finished task is handed out as a group (leased, redelivered when the lease runs out, gone once
acked), oldest first, and survives a restart of the API mid-lease."""

from __future__ import annotations

import time

import pytest
import requests

from tests.support.servers import AUTH, stop
from tests.support.pipeline import running_pipeline
from polar_mq.client import ApiError, Client
from tests.api.test_api import start_api


@pytest.fixture(scope="module")
def pipeline(gateway, tmp_path_factory):
    yield from running_pipeline(gateway, tmp_path_factory, "groups", init=2, run=2, postrun=1)


@pytest.fixture(scope="module")
def api(pipeline, log_dir):
    server = start_api(log_dir, pipeline.redis_url, name="api-groups")
    yield server
    stop(server.proc)


@pytest.fixture()
def client(api) -> Client:
    return Client(api.url, token="")


def drain_queue(client: Client) -> None:
    """Ack whatever earlier tests left, so each test sees only its own groups."""
    while True:
        groups = client.next_groups(limit=100, wait=0, lease=60)
        if not groups:
            return
        for g in groups:
            client.ack_group(g["task_id"], reason="skipped")


def echo_task(task_id: str, *, samples: int = 2, command: str = "echo hi", **over):
    body = {"task_id": task_id, "instruction": "say hi", "num_samples": samples,
            "agent": {"harness": "shell", "options": {"command": command}},
            "runtime": {"backend": "local"}, "builder": {"strategy": "per_request"}}
    body.update(over)
    return body


def test_group_lease_redelivery_and_ack(client, pipeline):
    drain_queue(client)
    sub = client.submit(echo_task("grp-lease", samples=3, metadata={"policy_version": 4, "step": 9}))
    t0 = time.monotonic()
    [group] = client.next_groups(limit=5, wait=60, lease=1.5, msgpack_body=False)  # the JSON answer
    assert time.monotonic() - t0 < 60
    assert group["task_id"] == "grp-lease" and group["delivery"] == 1
    assert group["policy_version"] == 4 and group["metadata"] == {"policy_version": 4, "step": 9}
    assert sorted(s["session_id"] for s in group["sessions"]) == sorted(sub["session_ids"])
    assert all(s["state"] == "COMPLETED" and s["reward"] == 1.0 for s in group["sessions"])
    assert len(group["trajectories"]) == 3
    assert all(t["metadata"]["policy_version"] == 4 for t in group["trajectories"])
    # Leased: nobody else gets it while the lease runs.
    assert client.next_groups(limit=5, wait=0) == []
    assert client.next_groups(limit=5, wait=0, msgpack_body=False) == []
    # Not acked in time: handed out again, delivery counts it; `wait` returns once the lease ran out.
    t1 = time.monotonic()
    [again] = client.next_groups(limit=5, wait=10, lease=60)
    assert again["task_id"] == "grp-lease" and again["delivery"] == 2
    assert time.monotonic() - t1 < 5
    # The msgpack answer Client uses by default is the same object as the contract's JSON one.
    same = {"delivery": 2, "lease_expires_at": None}
    assert {**again, **same} == {**group, **same}
    assert client.ack_group("grp-lease", reason="trained") == {"task_id": "grp-lease", "acked": True,
                                                               "already_acked": False}
    # Acked: never handed out again, even after the lease would have run out; re-ack is fine.
    assert client.next_groups(limit=5, wait=0.5) == []
    assert client.ack_group("grp-lease")["already_acked"] is True
    stats = client.group_stats()
    assert stats["redelivered"] >= 1 and stats["acked_by_reason"].get("trained", 0) >= 1
    assert client.status("grp-lease")["request"]["metadata"] == {"policy_version": 4, "step": 9}


def test_ack_after_lease_ran_out_still_acks(client, pipeline):
    drain_queue(client)
    client.submit(echo_task("grp-late-ack", samples=1))
    [group] = client.next_groups(wait=60, lease=0.2)
    time.sleep(0.4)
    assert client.ack_group(group["task_id"])["acked"] is True
    assert client.next_groups(wait=0.3) == []


def test_oldest_finished_first_and_errors(client, pipeline, api):
    drain_queue(client)
    client.submit(echo_task("grp-old", samples=1))
    pipeline.wait(pipeline.store.session_ids("grp-old"), timeout=60)
    client.submit(echo_task("grp-new", samples=1, command="exit 3"))  # an all-ERROR group is a group too
    pipeline.wait(pipeline.store.session_ids("grp-new"), timeout=60)
    groups = client.next_groups(limit=10, wait=0)
    assert [g["task_id"] for g in groups] == ["grp-old", "grp-new"]
    assert [s["state"] for s in groups[1]["sessions"]] == ["ERROR"]
    for g in groups:
        client.ack_group(g["task_id"])
    with pytest.raises(ApiError) as unknown:
        client.ack_group("no-such-task")
    assert unknown.value.status == 404
    client.submit(echo_task("grp-running", samples=1, command="sleep 30"))
    with pytest.raises(ApiError) as unfinished:
        client.ack_group("grp-running")
    assert unfinished.value.status == 409 and "not finished" in unfinished.value.detail
    bad = requests.get(f"{api.url}/v1/groups/next", headers=AUTH, params={"limit": "x"}, timeout=10)
    assert bad.status_code == 400 and bad.json()["field"] == "limit"
    client.cancel("grp-running")


def test_groups_survive_api_restart_mid_lease(pipeline, log_dir):
    first = start_api(log_dir, pipeline.redis_url, name="api-groups-restart")
    c1 = Client(first.url, token="")
    drain_queue(c1)
    c1.submit(echo_task("grp-restart", samples=2))
    [group] = c1.next_groups(wait=60, lease=2.0)
    assert group["delivery"] == 1
    stop(first.proc)  # the API dies while the trainer holds the lease
    second = start_api(log_dir, pipeline.redis_url, name="api-groups-restart2")
    try:
        c2 = Client(second.url, token="")
        [again] = c2.next_groups(wait=15, lease=60)  # the lease runs out across the restart
        assert again["task_id"] == "grp-restart" and again["delivery"] == 2
        assert [t["session_id"] for t in again["trajectories"]] == [t["session_id"] for t in group["trajectories"]]
        c2.ack_group("grp-restart")
    finally:
        stop(second.proc)


def test_stream_staleness_filter_and_advantages(client, pipeline):
    drain_queue(client)
    client.resume(policy_version=10)
    assert client.admin_status()["policy_version"] == 10
    for tid, version in (("grp-v7", 7), ("grp-v9", 9), ("grp-v10", 10)):
        client.submit(echo_task(tid, samples=2, metadata={"policy_version": version}))
    for tid in ("grp-v7", "grp-v9", "grp-v10"):
        pipeline.wait(pipeline.store.session_ids(tid), timeout=60)
    # Current version 10 (from GET /v1/admin/status), at most 1 behind: v7 is dropped and acked.
    stream = client.groups(batch=3, wait=1, max_staleness=1, advantages="leave_one_out", max_groups=2,
                           idle_timeout=5)
    got = list(stream)
    # Groups are handed out in the order they completed, and v9 and v10 run concurrently.
    assert sorted(g.task_id for g in got) == ["grp-v10", "grp-v9"]
    assert stream.stats.stale_dropped == 1 and stream.stats.yielded == 2
    assert all(g.advantages == [0.0, 0.0] for g in got)  # every reward 1.0
    assert all(t.metadata["advantage"] == 0.0 for g in got for t in g.trajectories)
    assert client.group_stats()["acked_by_reason"].get("stale", 0) >= 1
    for g in got:  # handed out, not acked: the trainer acks after its step
        stream.ack(g)
    # stale="keep": handed out flagged; uniform rewards dropped when asked.
    client.submit(echo_task("grp-v5", samples=2, metadata={"policy_version": 5}))
    keep = client.groups(wait=30, max_staleness=2, stale="keep", policy_version=lambda: 10, max_groups=1)
    [old] = list(keep)
    assert old.stale and keep.stats.stale_kept == 1
    keep.ack(old)
    client.submit(echo_task("grp-uniform", samples=2))
    picky = client.groups(wait=2, drop_uniform_reward=True, idle_timeout=3)
    assert list(picky) == [] and picky.stats.unusable_dropped == {"uniform_reward": 1}


def test_cli_groups_and_admin(client, api, pipeline):
    import json
    import os
    import subprocess
    import sys

    from tests.support.servers import ROOT

    def cli(*args: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "POLAR_API_TOKEN": "", "POLAR_HOME": os.environ.get("POLAR_HOME", "/tmp/polar-test-home")}
        return subprocess.run([sys.executable, "-m", "polar_mq.cli", *args, "--api", api.url], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=60)

    drain_queue(client)
    client.submit(echo_task("grp-cli", samples=2, metadata={"policy_version": 3}))
    out = cli("groups", "next", "--wait", "60", "--lease", "60")
    assert out.returncode == 0, out.stderr
    [line] = out.stdout.splitlines()
    group = json.loads(line)
    assert group["task_id"] == "grp-cli" and group["trajectories"] == 2 and group["delivery"] == 1
    assert cli("groups", "next").returncode == 3  # leased: nothing to hand out
    assert cli("groups", "ack", "grp-cli", "--reason", "trained").returncode == 0
    stats = json.loads(cli("groups", "stats").stdout)
    assert stats["acked_by_reason"]["trained"] >= 1 and stats["leased"] == 0
    assert cli("groups", "ack", "no-such").returncode == 2
    paused = json.loads(cli("admin", "pause", "--wait", "1").stdout)
    assert paused["paused"] is True and paused["drained"] is True
    assert json.loads(cli("admin", "status").stdout)["paused"] is True
    resumed = json.loads(cli("admin", "resume", "--policy-version", "12").stdout)
    assert resumed["paused"] is False and resumed["policy_version"] == 12
    status = json.loads(cli("admin", "status").stdout)
    assert status["paused"] is False and status["policy_version"] == 12
