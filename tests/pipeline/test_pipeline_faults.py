"""Faults: kill -9 of whole worker pools mid-session and a Redis restart (AOF) mid-run. Every
session must finish exactly once, nothing lost, never two harness runs of a session at once."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import redis

from tests.support.pipeline import TINY_AGENT, agent_task, make_pipeline
from polar_mq import states
from polar_mq.cli.embedded_redis import free_port, start_embedded

# The harness: note its start, run the tiny agent (model calls through the gateway), linger, note
# the end. A killed attempt leaves a start without an end.
SLOW_AGENT = (f'echo "start $$ $(date +%s.%N)" >> ../marks; {sys.executable} {TINY_AGENT}; sleep 3; '
              f'echo "end $$ $(date +%s.%N)" >> ../marks')


def wait_state(p, sids, wanted, timeout=30.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        recs = p.store.get_sessions(sids)
        hit = [r for r in recs if r.state in wanted]
        if hit:
            return hit
        time.sleep(0.1)
    raise AssertionError(f"no session reached {wanted}: {[r.state for r in p.store.get_sessions(sids)]}")


def marks(rec) -> list[str]:
    return (Path(rec.runtime.session_dir) / "marks").read_text().split("\n")


def assert_finished_once(rec):
    assert rec.state == states.COMPLETED, (rec.state, rec.error)
    terminal = [h for h in rec.history if h[0] in states.TERMINAL]
    assert len(terminal) == 1


def test_kill_run_worker_mid_session(gateway, tmp_path):
    p = make_pipeline(gateway, tmp_path)
    try:
        p.start_worker("init", 1)
        victim = p.start_worker("run", 2)
        p.start_worker("postrun", 1)
        _, sids = p.submit(agent_task(num_samples=2, agent={"harness": "shell", "options": {"command": SLOW_AGENT}}))
        running = wait_state(p, sids, {states.RUNNING})
        time.sleep(1.0)  # the harness is mid-run (its model calls done, sleeping)
        p.kill_worker(victim)
        p.start_worker("run", 2)
        recs = p.wait(sids, timeout=60)
        for rec in recs:
            assert_finished_once(rec)
            lines = [ln for ln in marks(rec) if ln]
            assert lines[-1].startswith("end") and sum(ln.startswith("end") for ln in lines) == 1
            traj = p.store.get_trajectory(rec.session_id)
            assert traj.status == "COMPLETED" and traj.stats["traces"] == 1 and traj.stats["calls"] == 2
        taken_over = [r for r in recs if r.session_id in {x.session_id for x in running}]
        assert taken_over and all(r.attempt >= 1 for r in taken_over)
        assert all(r.stats["run_attempts"] == 2 for r in taken_over)
        # The killed attempt's calls stay in their own gateway session; the trajectory is the new one's.
        assert all(r.gateway_session_id.endswith(".r1") for r in taken_over)
    finally:
        p.stop()


def test_kill_init_worker_mid_prepare(gateway, tmp_path):
    p = make_pipeline(gateway, tmp_path, POLAR_ALLOW_LOCAL_EXEC="1")  # a trusted task: exec on local
    try:
        victim = p.start_worker("init", 1)
        p.start_worker("run", 1)
        p.start_worker("postrun", 1)
        body = agent_task(num_samples=2, runtime={"backend": "local", "prepare": [
            {"exec": "echo prepared >> ../prepare.log; sleep 2"}]})
        _, sids = p.submit(body)
        wait_state(p, sids, {states.INITIALIZING})
        time.sleep(0.5)
        p.kill_worker(victim)
        p.start_worker("init", 1)
        recs = p.wait(sids, timeout=60)
        for rec in recs:
            assert_finished_once(rec)
            assert Path(rec.runtime.workdir, "polar.txt").exists()
        assert any(r.attempt >= 1 for r in recs)
    finally:
        p.stop()


def test_redis_restart_with_aof_loses_nothing(gateway, tmp_path):
    port, data = free_port(), tmp_path / "redis"
    data.mkdir()
    server = start_embedded(port, appendonly=True, workdir=str(data))
    # A lease outlives the restart (a holder fences itself after 0.6 TTL without Redis).
    p = make_pipeline(gateway, tmp_path, redis_server=server, POLAR_LEASE_TTL="8")
    try:
        p.start_worker("init", 1)
        p.start_worker("run", 2)
        p.start_worker("postrun", 1)
        _, sids = p.submit(agent_task(num_samples=3, agent={"harness": "shell", "options": {"command": SLOW_AGENT}}))
        wait_state(p, sids, {states.RUNNING})
        redis.Redis.from_url(server.url).shutdown(save=True)  # flushes the AOF
        server.process.wait(timeout=10)
        time.sleep(1.0)
        p.redis_server = start_embedded(port, appendonly=True, workdir=str(data))
        recs = p.wait(sids, timeout=90)
        for rec in recs:
            assert_finished_once(rec)
            assert p.store.get_trajectory(rec.session_id).stats["calls"] == 2
    finally:
        p.stop()
