"""The rollout pipeline end to end with real Celery worker pools (separate processes), real
redis-server, the real gateway and the stand-in model: init → READY → run → postrun."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from tests.support.pipeline import agent_task, make_pipeline
from polar_mq import states


@pytest.fixture(scope="module")
def pipeline(gateway, tmp_path_factory):
    p = make_pipeline(gateway, tmp_path_factory.mktemp("pipeline"),
                      POLAR_CALLBACK_ALLOW="127.0.0.1/32")  # the callback receivers listen on loopback
    p.start_worker("init", 2)
    p.start_worker("run", 2)
    p.start_worker("postrun", 1)
    yield p
    p.stop()


def test_end_to_end_several_samples(pipeline, gateway):
    task_id, sids = pipeline.submit(agent_task(num_samples=3, metadata={"group_id": "g1"}))
    recs = pipeline.wait(sids, timeout=90)
    assert [r.state for r in recs] == [states.COMPLETED] * 3
    for rec in recs:
        assert Path(rec.runtime.workdir, "polar.txt").read_text() == "hello from polar"
        assert rec.reward == 1.0 and rec.attempt == 0
        for stage in ("initializing", "ready", "running", "post_run"):
            assert f"{stage}_start" in rec.timings
        traj = pipeline.store.get_trajectory(rec.session_id)
        assert traj.status == "COMPLETED" and traj.builder == "prefix_merging"
        assert traj.stats["calls"] == 2 and traj.stats["traces"] == 1
        assert traj.stats["delivered_fraction"] == 1.0
        assert traj.metadata["group_id"] == "g1" and traj.metadata["harness"] == "shell"
        calls = gateway.calls(rec.gateway_session_id)
        trace = traj.traces[0]
        assert trace.prompt_ids + trace.response_ids == calls[-1]["prompt_token_ids"] + calls[-1]["completion_token_ids"]
        assert trace.reward == 1.0
        result_file = Path(pipeline.env["POLAR_RESULTS_DIR"]) / task_id / f"{rec.session_id}.json"
        assert json.loads(result_file.read_text())["session_id"] == rec.session_id


def test_timeout_gives_partial_trajectory(pipeline):
    # The agent makes its model calls, then hangs: the budget stops it, postrun still builds.
    script = ("import subprocess, sys, time; "
              f"subprocess.run([sys.executable, {str(Path(__file__).resolve().parents[2] / 'examples' / 'tiny_agent.py')!r}]); "
              "time.sleep(60)")
    body = agent_task(num_samples=1, timeout_seconds=6,
                      agent={"harness": "shell", "options": {"command": [sys.executable, "-c", script]}})
    _, sids = pipeline.submit(body)
    t0 = time.time()
    [rec] = pipeline.wait(sids, timeout=40)
    assert rec.state == states.TIMEOUT and time.time() - t0 < 30
    traj = pipeline.store.get_trajectory(rec.session_id)
    assert traj.status == "TIMEOUT" and traj.stats["calls"] == 2 and len(traj.traces) == 1
    assert traj.reward == 0.0


def test_harness_failure_is_error_with_output(pipeline):
    body = agent_task(num_samples=1, agent={"harness": "shell", "options": {"command": "echo boom >&2; exit 3"}})
    _, sids = pipeline.submit(body)
    [rec] = pipeline.wait(sids, timeout=30)
    assert rec.state == states.ERROR and "exited with 3" in rec.error and "boom" in rec.error


def test_cancel_stops_running_and_queued_sessions(pipeline):
    body = agent_task(num_samples=4, timeout_seconds=120,
                      agent={"harness": "shell", "options": {"command": "sleep 100"}})
    task_id, sids = pipeline.submit(body)
    deadline = time.time() + 20
    while time.time() < deadline:
        if any(r.state == states.RUNNING for r in pipeline.store.get_sessions(sids)):
            break
        time.sleep(0.2)
    pipeline.store.cancel_task(task_id)
    t0 = time.time()
    recs = pipeline.wait(sids, timeout=30)
    assert time.time() - t0 < 15
    assert all(r.state == states.ERROR and r.error == "cancelled" for r in recs)
    assert all(pipeline.store.get_trajectory(r.session_id).status == "ERROR" for r in recs)


def test_ready_buffer_backpressure(pipeline):
    """READY capacity is 2 and there are 2 run slots: with 8 long sessions, at most 2 are ever
    READY (prepared, waiting for a slot; init blocks once they are), sessions being prepared do not
    count against it, and both run slots stay busy."""
    body = agent_task(num_samples=8, timeout_seconds=120,
                      agent={"harness": "shell", "options": {"command": "sleep 1.5"}})
    _, sids = pipeline.submit(body)
    store = pipeline.store
    max_ready, max_running, samples = 0, 0, 0
    deadline = time.time() + 60
    while time.time() < deadline:
        recs = store.get_sessions(sids)
        by_state = [r.state for r in recs]
        max_ready = max(max_ready, by_state.count(states.READY), len(store.slots_held()))
        max_running = max(max_running, by_state.count(states.RUNNING))
        samples += 1
        if all(states.is_terminal(s) for s in by_state):
            break
        time.sleep(0.05)
    assert all(r.state == states.COMPLETED for r in store.get_sessions(sids))
    assert max_ready <= 2, max_ready
    assert max_running == 2


class FlakyReceiver:
    """An HTTP callback receiver that fails its first `failures` requests."""

    def __init__(self, failures: int):
        import http.server
        import threading

        self.failures = failures
        self.attempts = 0
        self.accepted: list[dict] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.attempts += 1
                if outer.attempts <= outer.failures:
                    self.send_response(503)
                    self.end_headers()
                    return
                outer.accepted.append(body)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_callbacks_retried_until_the_receiver_accepts(pipeline):
    receiver = FlakyReceiver(failures=3)
    task_id, sids = pipeline.submit(agent_task(num_samples=2, callback_url=receiver.url))
    pipeline.wait(sids, timeout=60)
    deadline = time.time() + 30
    while time.time() < deadline and len(receiver.accepted) < 3:
        time.sleep(0.2)
    receiver.server.shutdown()
    events = sorted(b["event"] for b in receiver.accepted)
    assert events == ["session.finished", "session.finished", "task.finished"]
    assert receiver.attempts == 3 + 3  # three refusals, then every message delivered once
    task_msg = next(b for b in receiver.accepted if b["event"] == "task.finished")
    assert task_msg["task_id"] == task_id and sorted(s["session_id"] for s in task_msg["sessions"]) == sorted(sids)
    session_msg = next(b for b in receiver.accepted if b["event"] == "session.finished")
    assert session_msg["trajectory"]["stats"]["traces"] == 1
