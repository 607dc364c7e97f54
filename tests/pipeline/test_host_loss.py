"""Host loss by heartbeats (tasks/host_loss.py): kill -9 of every process of a host while its
sessions run; each of them moves on to the other host within POLAR_HOST_LOSS_SECONDS (10 s) with
the default settings (POLAR_LEASE_TTL 8: the bound also waits for a cut-off holder's self-fence),
and completes there once, with its model calls in the trajectory. Two hosts on loopback (POLAR_NODE=alpha / beta, each with its
three pools); the figures are printed (pytest -s)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.support.pipeline import ROOT, TINY_AGENT, agent_task, make_pipeline
from polar_mq import states
from polar_mq.settings import PipelineSettings

AGENT = (f'echo "start $$" >> ../marks; {sys.executable} {TINY_AGENT} && sleep 6 && echo "end $$" >> ../marks')
DEFAULTS = PipelineSettings()
HOST_LOSS = DEFAULTS.host_loss_seconds


def start_host(p, node: str, run: int) -> list[subprocess.Popen]:
    procs = []
    for stage, n in (("init", 1), ("run", run), ("postrun", 1)):
        log = open(p.log_dir / f"worker-{node}-{stage}.log", "ab")
        procs.append(subprocess.Popen([sys.executable, "-m", "polar_mq.cli", "worker", "--stage", stage,
                                       "--concurrency", str(n), "--loglevel", "INFO"],
                                      stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
                                      env={**os.environ, **p.env, "POLAR_NODE": node}))
    p.workers.setdefault(node, []).extend(procs)
    return procs


def test_dead_host_sessions_move_on_within_the_bound(gateway, tmp_path):
    n = 4
    # The defaults (make_pipeline's own are shorter, for speed): lease TTL, janitor, host loss.
    p = make_pipeline(gateway, tmp_path, POLAR_LEASE_TTL=str(DEFAULTS.lease_ttl),
                      POLAR_JANITOR_INTERVAL=str(DEFAULTS.janitor_interval),
                      POLAR_HOST_LOSS_SECONDS=str(HOST_LOSS), POLAR_READY_CAPACITY=str(n))
    try:
        alpha = start_host(p, "alpha", run=n)
        _, sids = p.submit(agent_task(num_samples=n, agent={"harness": "shell", "options": {"command": AGENT}}))
        deadline = time.time() + 90
        while time.time() < deadline:
            recs = p.store.get_sessions(sids)
            if all(r.state == states.RUNNING for r in recs):
                break
            time.sleep(0.2)
        assert all(r.state == states.RUNNING and r.runtime_host == "alpha" for r in recs), \
            [(r.state, r.runtime_host) for r in recs]
        start_host(p, "beta", run=n)
        deadline = time.time() + 60
        while "beta" not in p.store.nodes() and time.time() < deadline:
            time.sleep(0.2)
        time.sleep(2.0)  # the harnesses are mid-run
        for proc in alpha:  # every process of host alpha, at once
            p.kill_worker(proc)
        killed = time.time()
        moved: dict[str, float] = {}
        while len(moved) < n and time.time() - killed < 3 * HOST_LOSS:
            for r in p.store.get_sessions(sids):
                if r.session_id not in moved and (r.attempt >= 1 or r.state != states.RUNNING):
                    moved[r.session_id] = time.time() - killed
            time.sleep(0.05)
        recs = p.wait(sids, timeout=120)
        done = time.time() - killed
        print(f"\nhost loss (defaults: lease TTL {DEFAULTS.lease_ttl:g} s, host loss {HOST_LOSS:g} s): {n} "
              f"sessions of the killed host moved on after {', '.join(f'{t:.1f}' for t in sorted(moved.values()))}"
              f" s; all COMPLETED {done:.1f} s after the kill (load {os.getloadavg()[0]:.1f})")
        assert len(moved) == n and max(moved.values()) <= HOST_LOSS, moved
        for rec in recs:
            assert rec.state == states.COMPLETED, (rec.state, rec.error)
            assert sum(h[0] in states.TERMINAL for h in rec.history) == 1
            assert rec.attempt == 1 and rec.runtime_host == "beta", (rec.attempt, rec.runtime_host)
            assert "alpha" in rec.stats.get("lost_runtimes", [])
            lines = [ln for ln in (Path(rec.runtime.session_dir) / "marks").read_text().split("\n") if ln]
            assert lines[-1].startswith("end") and sum(ln.startswith("end") for ln in lines) == 1, lines
            traj = p.store.get_trajectory(rec.session_id)
            assert traj.status == "COMPLETED" and traj.stats["calls"] == 2, traj.stats
    finally:
        p.stop()


def test_the_default_settings_bound_host_loss_to_ten_seconds():
    """Issue 38's goal with nothing configured: the bound of tasks/worker/host_loss.py."""
    from polar_mq.tasks.worker.host_loss import bound

    assert bound(DEFAULTS.host_loss_seconds, DEFAULTS.lease_ttl) <= 10.0
    assert bound(10.0, 15.0) > 10.0  # (the former default TTL could not)


def test_a_cut_off_holder_is_given_time_to_fence_itself():
    """A lease is taken from a silent node only once its holder, were it alive and cut off, has
    self-fenced and stopped its harness (SELF_FENCE × TTL + the kill since its last renewal)."""
    from polar_mq.tasks.worker.host_loss import HostWatch, lease_node

    ttl = 8.0  # self-fence at 4.8 s, harness stopped by 7.3 s after the last renewal
    assert not HostWatch._holder_stopped(int((ttl - 7.0) * 1000), ttl)
    assert HostWatch._holder_stopped(int((ttl - 7.4) * 1000), ttl)
    assert HostWatch._holder_stopped(-2, ttl)  # the lease is gone already
    assert lease_node("alpha:123:abcd1234") == "alpha"
    assert lease_node("host:with:colons:99:abcd1234") == "host:with:colons"
    assert lease_node(None) is None and lease_node("nonsense") is None
