"""Many hosts (network namespaces, tests/support/netns.py): a hub with Redis, model and gateway, two
worker hosts each running the three pools, separate session dirs, the `local` runtime.

Scenarios on one cluster, in order: baseline spread; kill every process of a host mid-run; cut a
host's link for longer than the lease and restore it; restart Redis (AOF) mid-run. For each:
sessions lost (must be 0), sessions whose harness ran to completion twice (0), time to recover
(fault → every session finished). Figures are printed (pytest -s) as `many-hosts: ...`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter

import pytest

from tests.support.netns import Cluster, netns_unavailable
from tests.support.pipeline import TINY_AGENT
from polar_mq import states

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(netns_unavailable() is not None, reason=str(netns_unavailable()))]

# Run slots per host: a host alone can take every session of a scenario in two waves, so the
# scenarios after a fault wait less for slots (the suite's time, not what is asserted).
RUN_SLOTS = 4

# Note the start and the end of each harness run next to the session's dir (on its host's disk).
AGENT = (f'echo "start $$" >> ../marks; {sys.executable} {TINY_AGENT} && sleep {{linger}} && '
         f'echo "end $$" >> ../marks')


def body(n: int, linger: float) -> dict:
    return {"instruction": "Write hello into polar.txt", "num_samples": n, "timeout_seconds": 120,
            "agent": {"harness": "shell", "model": "policy",
                      "options": {"command": AGENT.format(linger=linger)}},
            "runtime": {"backend": "local"}, "builder": {"strategy": "prefix_merging"}}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(base=tmp_path_factory.mktemp("hosts"))
    try:
        c.build_network(["a", "b"])
        c.start_hub()
        c.start_pools("a", run=RUN_SLOTS)
        c.start_pools("b", run=RUN_SLOTS)
        c.wait_nodes(["a", "b"])
        yield c
    finally:
        c.stop()


def ran_on(rec) -> str | None:
    return rec.runtime_host


def check(cluster: Cluster, sids: list[str], recs, label: str, t_fault: float | None = None) -> dict:
    """Every session COMPLETED once, with exactly one attempt's calls; returns the figures."""
    lost = [r.session_id for r in recs if r.state != states.COMPLETED]
    twice = [r.session_id for r in recs if Counter(m.split()[0] for m in cluster.marks(r.session_id))["end"] > 1]
    for r in recs:
        traj = cluster.store.get_trajectory(r.session_id)
        assert traj is not None and traj.stats["calls"] == 2, (r.session_id, traj and traj.stats)
        assert traj.metadata["gateway_session_id"] == r.gateway_session_id
        assert r.gateway_session_id not in r.stats.get("abandoned_gateway_sessions", [])
    figures = {"sessions": len(sids), "lost": len(lost), "run_twice": len(twice),
               "spread": dict(Counter(ran_on(r) for r in recs)),
               "attempts": sum(r.attempt for r in recs)}
    if t_fault is not None:
        figures["recover_s"] = round(max(r.updated_at for r in recs) - t_fault, 1)
    print(f"many-hosts: {label}: {figures}")
    assert not lost, [(r.session_id, r.state, r.error) for r in recs if r.state != states.COMPLETED]
    assert not twice, twice
    return figures


def wait_running_on(cluster: Cluster, sids: list[str], host: str, timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if any(r.state == states.RUNNING and ran_on(r) == host for r in cluster.store.get_sessions(sids)):
            return
        time.sleep(0.1)
    raise AssertionError(f"no session running on {host}")


def test_baseline_spreads_over_hosts_and_runs_where_prepared(cluster):
    sids = cluster.submit(body(8, 0.5))
    recs = cluster.wait(sids, timeout=90)
    figures = check(cluster, sids, recs, "baseline")
    assert set(figures["spread"]) == {"a", "b"}, figures
    for r in recs:  # run and postrun on the host whose init prepared the runtime
        later = {n.split(":")[0] for s, _, n in r.history if s in (states.RUNNING, states.BUILDING) and n}
        assert later == {ran_on(r)} and r.attempt == 0, r.history
    view = json.loads(subprocess.run([sys.executable, "-m", "polar_mq.cli", "status", "--cluster", "--json",
                                      "--redis", cluster.redis_url], capture_output=True, text=True,
                                     check=True).stdout)
    assert {n["node"] for n in view["nodes"] if n["alive"]} == {"a", "b"}, view
    assert {"run@a", "run@b", "postrun@a", "postrun@b", "init"} <= set(view["queues"]), view
    assert view["ready"]["waiting"] == 0 and view["sessions"] == {}, view


def test_kill_every_process_of_a_host_mid_run(cluster):
    sids = cluster.submit(body(8, 3))
    wait_running_on(cluster, sids, "a")
    t_fault = time.time()
    killed = cluster.kill_host("a")
    assert killed > 0
    recs = cluster.wait(sids, timeout=120)
    figures = check(cluster, sids, recs, "kill host a", t_fault)
    assert figures["spread"] == {"b": 8} or set(figures["spread"]) <= {"a", "b"}
    for r in recs:
        assert ran_on(r) == "b" or r.timings.get("completed_start", 0) < t_fault, r.history
    cluster.start_pools("a", run=RUN_SLOTS)
    cluster.wait_nodes(["a", "b"])


def test_cut_a_host_off_longer_than_the_lease(cluster):
    sids = cluster.submit(body(6, 4))
    wait_running_on(cluster, sids, "b")
    t_fault = time.time()
    cluster.cut("b")
    time.sleep(3 * cluster.lease_ttl)  # past the lease and the node's liveness
    cluster.restore("b")
    recs = cluster.wait(sids, timeout=120)
    check(cluster, sids, recs, f"cut host b for {3 * cluster.lease_ttl:.0f} s", t_fault)
    # What the cut-off sessions left on b (work dir, HOME) is torn down by b itself once it is
    # back; the logs stay, as after a postrun.
    moved = [r for r in recs if "b" in r.stats.get("lost_runtimes", []) and ran_on(r) != "b"]
    assert moved, [r.history for r in recs]
    dirs = [cluster.hosts["b"].sessions_dir / r.task_id / r.session_id for r in moved]
    left = lambda: {str(d): sorted(p.name for p in d.iterdir() if p.name != "logs") for d in dirs}  # noqa: E731
    deadline = time.time() + 10
    while time.time() < deadline and any(left().values()):
        time.sleep(0.2)
    assert not any(left().values()), left()
    assert cluster.store.counters().get("leftover_runtimes_torn_down", 0) >= len(moved)


def test_restart_redis_mid_run(cluster):
    sids = cluster.submit(body(6, 3))
    wait_running_on(cluster, sids, "a")
    t_fault = time.time()
    down = cluster.restart_redis()
    recs = cluster.wait(sids, timeout=120)
    figures = check(cluster, sids, recs, f"redis restart (down {down:.1f} s)", t_fault)
    # Every pool survived the restart (kombu's restore_unacked AttributeError is handled).
    for host in cluster.hosts.values():
        assert all(p.poll() is None for p in host.procs), [p.args for p in host.procs if p.poll() is not None]
    assert figures["lost"] == 0
