"""The multi-host soak's path at a small size, in the default run: bench/bench_soak.py --hosts 2
(a hub and two worker hosts as network namespaces, tests/support/netns.py), 32 sessions of the
curl agent replaying a real CLI's recorded chat calls through the gateway, threads pool. The
1,024-session run is the same command with --hosts 4 --sessions 1024 (docs/benchmarks.md). Its
Redis traffic (MONITOR) then replays through bench/bench_redis_ceiling.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.netns import netns_unavailable

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(netns_unavailable() is not None, reason=str(netns_unavailable()))]

SESSIONS, HOSTS, RUN_SLOTS = 32, 2, 16


def test_soak_across_two_hosts(tmp_path) -> None:
    out = tmp_path / "soak.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_soak.py"), "--hosts", str(HOSTS),
                           "--sessions", str(SESSIONS), "--pools", "threads", "--run-slots", str(RUN_SLOTS),
                           "--hold", "1", "--idle", "1", "--timeout", "120", "--json", str(out),
                           "--monitor", str(tmp_path / "monitor")],
                          capture_output=True, text=True, timeout=240, cwd=ROOT,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    print(proc.stdout[-4000:])
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    [res] = json.loads(out.read_text())
    assert (res["completed"], res["lost"], res["duplicated"]) == (SESSIONS, 0, 0), res["first_errors"]
    # every session made both recorded calls through the gateway, each captured once
    assert res["calls_captured"] == SESSIONS * res["calls_per_session"] == SESSIONS * 2
    # both hosts ran sessions, each in one run pool process holding all its slots
    per_host = dict(part.split() for part in res["sessions_per_host"].split(", "))
    assert set(per_host) == {"w0", "w1"} and sum(map(int, per_host.values())) == SESSIONS, per_host
    assert res["run_pool_processes"] == HOSTS and res["slots_init_run_postrun"].split("/")[1] == str(HOSTS * RUN_SLOTS)
    assert res["peak_running"] > RUN_SLOTS  # more sessions at once than one host holds
    # the figures the 1,024-session table is made of are there and measured
    assert res["redis_cpu_ms_per_session"] > 0 and res["redis_cmds_per_session"] > 10
    assert res["redis_bytes_per_session"] > 1000 and 0 < res["run_pool_pss_mib"] < 1024
    assert res["gateway_ms_p50"] > 0 and res["dispatch_rate_per_s"] > 0
    # the gateway's added latency is paired per call with its capture record's upstream time
    assert res["gateway_added_paired_calls"] == SESSIONS * 2

    # the run's Redis traffic, captured, replays against a bare Redis (where one Redis ends)
    ceiling = tmp_path / "ceiling.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_redis_ceiling.py"),
                           str(tmp_path / "monitor.threads"), "--procs", "1", "--seconds", "2",
                           "--json", str(ceiling)], capture_output=True, text=True, timeout=60, cwd=ROOT)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    c = json.loads(ceiling.read_text())
    assert c["sessions_replayed"] >= SESSIONS and c["commands_per_session"] > 10
    # the replay is faithful: rewritten copies run the scripts' paths, not errors
    assert c["error_replies"] <= 0.01 * c["sessions_replayed"] * c["commands_per_session"], c
    assert c["redis_cpu_ms_per_session"] > 0
