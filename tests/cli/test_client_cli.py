"""The Python client and the `polar-mq submit/status/results` commands against a served API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest
import redis

from polar_mq import states
from polar_mq.client import ApiError, Client
from polar_mq.cli.embedded_redis import free_port
from polar_mq.model import Trace, Trajectory
from polar_mq.store.pipeline import PipelineStore
from polar_mq.store.core import Keys, connect

from tests.support.servers import ROOT, spawn, stop

TOKEN = "client-token"
STAGES = (states.INITIALIZING, states.READY, states.RUNNING, states.POST_RUN, states.BUILDING, states.EVALUATING)

TASK_YAML = """\
task_id: {task_id}
instruction: write hello
num_samples: {n}
agent:
  harness: shell
  options:
    command: echo hello
metadata:
  suite: client-test
"""


@pytest.fixture(scope="module")
def api_redis(redis_url) -> str:
    url = redis_url.rsplit("/", 1)[0] + "/12"
    redis.Redis.from_url(url).flushdb()
    return url


@pytest.fixture(scope="module")
def api(log_dir, api_redis) -> str:
    port = free_port()
    server = spawn([sys.executable, "-m", "polar_mq.cli", "api", "--port", str(port), "--redis", api_redis,
                    "--workers", "1", "--token", TOKEN],
                   f"http://127.0.0.1:{port}/health", log_dir, f"api-client-{port}")
    yield server.url
    stop(server.proc)


@pytest.fixture(scope="module")
def store(api_redis) -> PipelineStore:
    return PipelineStore(connect(api_redis))


@pytest.fixture()
def client(api) -> Client:
    return Client(api, token=TOKEN)


def finish(store: PipelineStore, sid: str, task_id: str, status: str, reward: float | None,
           harness: str = "shell") -> None:
    for st in STAGES:
        store.transition(sid, st, node="fake-worker:1")
    trace = Trace(prompt_ids=[5, 6], response_ids=[7, 8, 9], loss_mask=[1, 1, 1],
                  response_logprobs=[-0.1, -0.2, -0.3],
                  messages=[{"role": "user", "content": "write hello"}, {"role": "assistant", "content": "hello"}],
                  tools=[], reward=reward, metadata={"role": "main"})
    store.save_trajectory(Trajectory(session_id=sid, task_id=task_id, status=status, traces=[trace],
                                     reward=reward, metadata={"harness": harness}))
    store.transition(sid, status, node="fake-worker:1", reward=reward, outcome=status)


def fake_workers(store: PipelineStore, task_id: str, sids: list[str], delay: float = 0.3,
                 rewards: list[float | None] | None = None) -> threading.Thread:
    rewards = rewards or [1.0] * len(sids)

    def run() -> None:
        for sid, reward in zip(sids, rewards):
            time.sleep(delay)
            finish(store, sid, task_id, states.COMPLETED, reward)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def cli(*args: str, api: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "polar_mq.cli", *args, "--api", api], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "POLAR_API_TOKEN": TOKEN, "COLUMNS": "200", **(env or {})})


# --- Python client ------------------------------------------------------------------------------
def test_client_submit_status_wait_results(client, store, tmp_path):
    path = tmp_path / "task.yaml"
    path.write_text(TASK_YAML.format(task_id="client-1", n=3))
    sub = client.submit(str(path))
    assert sub["task_id"] == "client-1" and len(sub["session_ids"]) == 3
    assert client.submit(path) == sub  # idempotent (PathLike too)
    st = client.status("client-1")
    assert st["state"] == "pending" and st["counts"] == {"REGISTERED": 3}

    updates: list[dict] = []
    fake_workers(store, "client-1", sub["session_ids"], rewards=[1.0, 0.0, 0.5])
    final = client.wait("client-1", timeout=30, poll=0.1, on_update=updates.append)
    assert final["state"] == "done" and final["counts"] == {"COMPLETED": 3}
    assert len(updates) >= 3 and updates[0]["state"] in ("pending", "running")

    res = client.results("client-1")
    assert res["count"] == 3
    assert [t["session_id"] for t in client.results("client-1", min_reward=0.5)["trajectories"]] == \
        [sub["session_ids"][0], sub["session_ids"][2]]
    assert client.results("client-1", status=["ERROR"])["count"] == 0
    assert client.session(sub["session_ids"][1])["reward"] == 0.0
    assert any(t["task_id"] == "client-1" for t in client.tasks())


def test_client_errors(client, api, tmp_path):
    with pytest.raises(ApiError) as info:
        client.submit({"instruction": "x", "agent": {"harness": "shell"}})
    assert info.value.status == 400 and info.value.field == "agent.options.command"
    assert "agent.options.command" in str(info.value)
    with pytest.raises(ApiError) as info:
        client.status("missing-task")
    assert info.value.status == 404
    with pytest.raises(ApiError) as info:
        Client(api, token="wrong").status("x")
    assert info.value.status == 401 and info.value.problem["type"].endswith("unauthorized")
    with pytest.raises(ApiError) as info:
        Client(f"http://127.0.0.1:{free_port()}", token=TOKEN, timeout=2).status("x")
    assert info.value.status == 0
    client.submit({"task_id": "conflict-1", "instruction": "a", "agent": {"harness": "codex"}})
    with pytest.raises(ApiError) as info:
        client.submit({"task_id": "conflict-1", "instruction": "b", "agent": {"harness": "codex"}})
    assert info.value.status == 409
    with pytest.raises(TimeoutError):
        client.wait("conflict-1", timeout=0.3, poll=0.1)


def test_client_env_defaults(monkeypatch, api):
    monkeypatch.setenv("POLAR_API_URL", api + "/")
    monkeypatch.setenv("POLAR_API_TOKEN", TOKEN)
    c = Client()
    assert c.url == api and c.health()["status"] == "ok"
    assert isinstance(c.tasks(), list)
    monkeypatch.delenv("POLAR_API_URL")
    assert Client().url == "http://127.0.0.1:8700"


def test_client_cancel_pause_resume(client, store):
    sids = client.submit({"task_id": "client-cancel", "instruction": "x", "num_samples": 2,
                          "agent": {"harness": "codex"}})["session_ids"]
    body = client.cancel("client-cancel")
    assert body["cancelled"] and {s["state"] for s in body["sessions"]} == {"ERROR"}
    assert client.wait("client-cancel", timeout=5)["state"] == "done"
    from polar_mq.store.pause import PauseState

    keys = Keys()
    gate = PauseState(store.r, keys)  # a live gateway process with one generation in flight
    gate.heartbeat("gw-client-test", {"upstreams": []})
    gate.begin("gw-client-test")
    body = client.pause(wait=0.2)
    assert (body["paused"], body["in_flight"], body["drained"]) == (True, 1, False)
    gate.end("gw-client-test")
    assert client.pause(wait=1)["drained"] is True
    assert client.admin_status()["paused"] is True
    assert client.resume(policy_version=3)["paused"] is False
    assert not store.r.exists(keys.gateway_paused()) and client.admin_status()["policy_version"] == 3
    gate.forget("gw-client-test")


# --- CLI ----------------------------------------------------------------------------------------
def test_cli_submit_wait_status_results(api, store, tmp_path):
    path = tmp_path / "task.yaml"
    path.write_text(TASK_YAML.format(task_id="cli-1", n=2))
    sids_box: list[str] = []

    def workers() -> None:  # start once the CLI has submitted
        deadline = time.time() + 30
        while time.time() < deadline and len(store.session_ids("cli-1")) < 2:
            time.sleep(0.05)
        sids_box.extend(store.session_ids("cli-1"))
        time.sleep(0.5)
        finish(store, sids_box[0], "cli-1", states.COMPLETED, 1.0)
        time.sleep(0.3)
        finish(store, sids_box[1], "cli-1", states.COMPLETED, 0.25)

    thread = threading.Thread(target=workers, daemon=True)
    thread.start()
    proc = cli("submit", str(path), "--wait", "--poll", "0.1", "--timeout", "30", api=api)
    thread.join(5)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "task cli-1: 2 session(s)" in proc.stdout
    assert "COMPLETED" in proc.stdout and sids_box[0] in proc.stdout  # the summary table
    assert "finished" in proc.stderr  # the progress display

    proc = cli("status", "cli-1", api=api)
    assert proc.returncode == 0, proc.stderr
    assert "cli-1" in proc.stdout and "COMPLETED" in proc.stdout
    proc = cli("status", "cli-1", "--json", api=api)
    assert json.loads(proc.stdout)["counts"] == {"COMPLETED": 2}

    proc = cli("results", "cli-1", api=api)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(rows) == 2 and rows[0]["response_ids"] == [7, 8, 9]

    out = tmp_path / "min.jsonl"
    proc = cli("results", "cli-1", "--out", str(out), "--min-reward", "0.5", api=api)
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line)["reward"] for line in out.read_text().splitlines()] == [1.0]

    pq = pytest.importorskip("pyarrow.parquet")
    out = tmp_path / "rows.parquet"
    proc = cli("results", "cli-1", "--out", str(out), "--format", "parquet", api=api)
    assert proc.returncode == 0, proc.stderr
    table = pq.read_table(out)
    assert table.num_rows == 2 and table.column("prompt_ids").to_pylist() == [[5, 6], [5, 6]]

    out = tmp_path / "sft.jsonl"
    proc = cli("results", "cli-1", "--out", str(out), "--format", "sft", "--harness", "shell", api=api)
    assert proc.returncode == 0, proc.stderr
    sft = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(sft) == 2 and sft[0]["messages"][-1] == {"role": "assistant", "content": "hello"}

    proc = cli("results", "cli-1", "--format", "parquet", api=api)
    assert proc.returncode == 2


def test_cli_errors(api, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"instruction": "x", "agent": {"harness": "nope"}}))
    proc = cli("submit", str(bad), api=api)
    assert proc.returncode == 2 and "agent.harness" in proc.stderr
    proc = cli("submit", str(tmp_path / "missing.yaml"), api=api)
    assert proc.returncode == 2
    proc = cli("status", "nope", api=api)
    assert proc.returncode == 1 and "404" in proc.stderr
    proc = cli("status", "nope", api=api, env={"POLAR_API_TOKEN": "wrong"})
    assert proc.returncode == 1 and "401" in proc.stderr
    good = tmp_path / "t.json"
    good.write_text(json.dumps({"task_id": "cli-timeout", "instruction": "x", "agent": {"harness": "codex"}}))
    proc = cli("submit", str(good), "--wait", "--timeout", "0.5", "--poll", "0.1", api=api)
    assert proc.returncode == 124


def _sft_session(store: PipelineStore, sid: str, task_id: str, grade, sft_file) -> None:
    """A session graded in offline SFT mode, as the postrun stage records it."""
    from polar_mq.graders import sft as offline

    for st in STAGES:
        store.transition(sid, st, node="fake-worker:1")
    trace = Trace(prompt_ids=[5], response_ids=[7], loss_mask=[1],
                  messages=[{"role": "user", "content": f"fix {sid}"}, {"role": "assistant", "content": f"done {sid}"}],
                  tools=[{"type": "function", "function": {"name": "bash"}}], metadata={"role": "main"})
    traj = Trajectory(session_id=sid, task_id=task_id, status=states.COMPLETED, traces=[trace], reward=grade.reward,
                      metadata={"harness": "shell", "grade": grade.to_dict()})
    traj.metadata["sft"] = offline.record(sft_file, traj, grade)
    store.save_trajectory(traj)
    store.transition(sid, states.COMPLETED, node="fake-worker:1", reward=grade.reward, outcome=states.COMPLETED)


def test_cli_results_offline_sft(api, client, store, tmp_path):
    """--format sft on an offline-SFT task: the accepted rows (as in the workers' SFT file) and the
    accepted/attempted counts, from the .stats.json when it is here, else computed."""
    from polar_mq.graders import Grade

    sids = client.submit({"task_id": "cli-sft", "instruction": "x", "num_samples": 3,
                          "agent": {"harness": "shell", "options": {"command": "true"}}})["session_ids"]
    sft_file = tmp_path / "results" / "cli-sft" / "sft.jsonl"
    grades = [Grade(1.0, passed=True, metadata={"instance_id": "calc__calc-1"}), Grade(0.0, passed=False),
              Grade.error("runtime down")]
    for sid, grade in zip(sids, grades):
        _sft_session(store, sid, "cli-sft", grade, sft_file)

    out = tmp_path / "accepted.jsonl"
    proc = cli("results", "cli-sft", "--format", "sft", "--out", str(out), api=api)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows == [json.loads(line) for line in sft_file.read_text().splitlines()]  # the file's rows
    assert [r["session_id"] for r in rows] == [sids[0]] and rows[0]["instance_id"] == "calc__calc-1"
    assert "1 row(s) from 1 accepted of 3 trajectorie(s)" in proc.stderr
    assert "1 accepted / 2 attempted (50.0%), 1 grader error(s), 1 row(s) in " + str(sft_file) in proc.stderr
    assert "counts from " + str(sft_file) + ".stats.json" in proc.stderr

    # stdout, and --all: every trajectory's SFT rows
    proc = cli("results", "cli-sft", "--format", "sft", api=api)
    assert [json.loads(line)["session_id"] for line in proc.stdout.splitlines()] == [sids[0]]
    proc = cli("results", "cli-sft", "--format", "sft", "--all", api=api)
    assert sorted(json.loads(line)["session_id"] for line in proc.stdout.splitlines()) == sorted(sids)
    assert "offline SFT" not in proc.stderr

    # a file shared with another task: its own counts, and this task's next to them
    shared = tmp_path / "shared.jsonl"
    from polar_mq.graders import sft as offline
    offline.record(shared, Trajectory(session_id="other-task-session", task_id="other"), Grade(0.0))
    for sid, grade in zip(sids, grades):
        offline.record(shared, Trajectory(session_id=sid, task_id="cli-sft"), grade)
    proc = cli("results", "cli-sft", "--format", "sft", "--sft-file", str(shared), api=api)
    assert "1 accepted / 3 attempted (33.3%)" in proc.stderr
    assert "this task: 1 accepted / 2 attempted (50.0%), 1 grader error(s)" in proc.stderr

    # the file is not on this machine (it lives on the workers): the counts come from the results
    sft_file.with_name("sft.jsonl.stats.json").unlink()
    proc = cli("results", "cli-sft", "--format", "sft", api=api, env={"POLAR_RESULTS_DIR": str(tmp_path / "none")})
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line)["session_id"] for line in proc.stdout.splitlines()] == [sids[0]]
    assert "1 accepted / 2 attempted (50.0%), 1 grader error(s) (computed from the results" in proc.stderr
    # the other formats are not filtered
    proc = cli("results", "cli-sft", api=api)
    assert len(proc.stdout.splitlines()) == 3
    proc = cli("results", "cli-sft", "--help", api=api)
    assert "keep_only_passing" in proc.stdout and "--sft-file" in proc.stdout
