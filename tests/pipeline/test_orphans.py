"""Orphaned runtimes: what a worker killed with SIGKILL left running on its host is found by the
next worker that starts there, killed, and reported (log, counters, the session's events)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from tests.support.pipeline import agent_task, make_pipeline
from polar_mq import states
from polar_mq.api.views import session_summary
from polar_mq.store.pipeline import PipelineStore
from polar_mq.runtimes import orphans
from polar_mq.store.core import connect


def alive(pid: int) -> bool:
    return orphans._start_time(pid) is not None  # a zombie is dead


def wait_until(pred, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _marked_sleep(marker: str) -> subprocess.Popen:
    return subprocess.Popen(["sleep", "60"], env={**os.environ, orphans.OWNER_VAR: marker},
                            start_new_session=True)


def test_only_this_nodes_processes_with_a_dead_supervisor_are_reaped(redis_url):
    dep = orphans.deployment_id(redis_url)
    gone = subprocess.Popen(["sleep", "0.1"])
    gone_start = orphans._start_time(gone.pid)
    gone.wait()
    me = f"{os.getpid()}|{orphans._start_time(os.getpid())}"
    orphan = _marked_sleep(f"node-a|{dep}|sess-orphan|{gone.pid}|{gone_start}")
    supervised = _marked_sleep(f"node-a|{dep}|sess-live|{me}")
    reused_pid = _marked_sleep(f"node-a|{dep}|sess-reused|{os.getpid()}|1")  # same pid, other start time
    other_node = _marked_sleep(f"node-b|{dep}|sess-b|{gone.pid}|{gone_start}")
    other_deployment = _marked_sleep(f"node-a|{orphans.deployment_id('redis://x')}|sess-c|{gone.pid}|{gone_start}")
    procs = [orphan, supervised, reused_pid, other_node, other_deployment]
    store = PipelineStore(connect(redis_url))
    before = store.counters()
    try:
        found = orphans.reap(store, "node-a", redis_url)
        assert sorted(o.session_id for o in found) == ["sess-orphan", "sess-reused"]
        assert {p for o in found for p in o.pids} == {orphan.pid, reused_pid.pid}
        for p in (orphan, reused_pid):
            p.wait(timeout=5)
        assert all(p.poll() is None for p in (supervised, other_node, other_deployment))
        after = store.counters()
        assert after.get("orphaned_runtimes_reaped", 0) - before.get("orphaned_runtimes_reaped", 0) == 2
        assert after.get("orphaned_processes_reaped", 0) - before.get("orphaned_processes_reaped", 0) == 2
        assert orphans.reap(store, "node-a", redis_url) == []  # nothing twice
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


# First attempt: start a process that escapes the harness's process group (setsid, as a daemon
# would) and one that stays in it, then block. The attempt after a takeover just finishes.
HARNESS = """
if [ -e ../first ]; then echo second attempt; exit 0; fi
touch ../first
setsid sleep 300 & echo $! > ../escaped.pid
sleep 300 & echo $! > ../grouped.pid
sleep 300
"""


def test_worker_killed_9_leaves_orphans_the_next_worker_reaps(gateway, tmp_path):
    p = make_pipeline(gateway, tmp_path, POLAR_NODE="orphan-host", POLAR_ORPHAN_SCAN_INTERVAL="0",
                      POLAR_MAX_ATTEMPTS="10")
    pids: list[int] = []
    try:
        p.start_worker("init", 1)
        victim = p.start_worker("run", 1)
        p.start_worker("postrun", 1)
        _, (sid,) = p.submit(agent_task(num_samples=1, agent={"harness": "shell", "options": {"command": HARNESS}}))
        sdir = tmp_path / "sessions"
        wait_until(lambda: any(sdir.glob("*/*/grouped.pid")) and any(sdir.glob("*/*/escaped.pid")), 60,
                   "the harness to start its children")
        session_dir = next(sdir.glob("*/*/grouped.pid")).parent
        time.sleep(0.3)
        escaped = int((session_dir / "escaped.pid").read_text())
        grouped = int((session_dir / "grouped.pid").read_text())
        pids = [escaped, grouped]
        p.kill_worker(victim)
        time.sleep(1.0)
        # The harness shell died with its worker; what it started did not: orphans.
        assert alive(escaped) and alive(grouped)
        assert os.getpgid(escaped) != os.getpgid(grouped)

        p.start_worker("run", 1)
        wait_until(lambda: not alive(escaped) and not alive(grouped), 30, "the orphans to be killed")
        # The session itself goes on as any lost worker's does (taken over, or re-initialised when
        # the node's run pool stayed away too long on a busy box): not what is tested here.
        rec = p.wait([sid], timeout=90)[0]
        assert states.is_terminal(rec.state)
        reaped = [e for e in rec.events if e["event"] == "orphans_reaped"]
        assert escaped in {pid for entry in reaped for pid in entry["pids"]}
        assert all(entry["node"] == "orphan-host" for entry in reaped)
        assert session_summary(rec)["events"] == rec.events  # in GET /v1/tasks/<id>
        counters = p.store.counters()
        assert counters["orphaned_runtimes_reaped"] >= 1 and counters["orphaned_processes_reaped"] >= 1
        logs = "".join(f.read_text(errors="replace") for f in Path(tmp_path).glob("worker-run-*.log"))
        assert "orphaned runtime process group" in logs and sid in logs
    finally:
        p.stop()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
