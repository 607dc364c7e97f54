"""Dispatch throughput: no-op sessions through real pools, this tree against an older ref.

A no-op session is a real session with nothing to do: the `shell` harness runs `true` in the
`local` runtime, the per_request builder builds an empty trajectory, no grader. It goes through
everything a real one does — the API stores the task, an init worker takes the lease and moves
the session, starts the runtime and registers a gateway session over HTTP, a run worker launches
the harness process, a postrun worker asks the gateway for the calls, stores the trajectory and
the result file — so sessions/s here is the pipeline's own overhead per session.

The same workload runs twice in one invocation, on the same machine and the same Redis: once with
the code of `--baseline REF` (a `git archive` of that ref put first on the children's PYTHONPATH)
and once with this tree, and the table prints both rates and their ratio.

    python bench/bench_dispatch.py [--sessions 400] [--baseline main] [--pools 2,2,2]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_gateway import export_ref  # noqa: E402
from polar_mq.client import Client  # noqa: E402
from polar_mq.cli.embedded_redis import free_port  # noqa: E402
from polar_mq.cli.up import launch  # noqa: E402

NOOP = {"instruction": "noop", "timeout_seconds": 600,
        "agent": {"harness": "shell", "options": {"command": "true"}},
        "runtime": {"backend": "local"},
        "builder": {"strategy": "per_request"}}


def cpu_seconds(root_pids: list[int]) -> dict[int, float]:
    """CPU seconds (user + system, with reaped children) of every live process under root_pids."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        stats[int(entry.name)] = (int(fields[1]), sum(int(f) for f in fields[11:15]) / tick)
    out: dict[int, float] = {}
    for pid in stats:
        p = pid
        while p in stats and p not in root_pids and p > 1:
            p = stats[p][0]
        if p in root_pids:
            out[pid] = stats[pid][1]
    return out


def cpu_by_role(stack, before: dict[int, float], after: dict[int, float]) -> dict[str, float]:
    roles = {c.proc.pid: c.name for c in stack.supervisor.children}
    if stack.embedded is not None:
        roles[stack.embedded.process.pid] = "redis"
    parent = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                pass
    out: dict[str, float] = {}
    for pid, t in after.items():
        p = pid
        while p not in roles and p in parent and p > 1:
            p = parent[p]
        name = roles.get(p, "?").replace("worker_", "") + ("" if pid == p or p not in roles else "+")
        out[name] = out.get(name, 0.0) + t - before.get(pid, 0.0)
    return out


def measure(label: str, tmp: Path, pools: tuple[int, int, int], sessions: int,
            pythonpath: Path | None, warmup: int) -> dict:
    env = {"POLAR_SESSIONS_DIR": str(tmp / label / "sessions"), "POLAR_RESULTS_DIR": str(tmp / label / "results"),
           "POLAR_READY_CAPACITY": str(max(8, sessions))}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    os.environ["POLAR_LOG_DIR"] = str(tmp / label / "logs")
    stack = launch(api_port=free_port(), gateway_port=free_port(), flower=False,
                   concurrency=pools, extra_env=env)
    try:
        client = Client(stack.api_url, token=stack.token)
        if warmup:  # first tasks import modules and open connections in every pool process
            sub = client.submit({**NOOP, "num_samples": warmup})
            client.wait(sub["task_id"], timeout=300, poll=0.05)
        roots = [c.proc.pid for c in stack.supervisor.children] + \
            ([stack.embedded.process.pid] if stack.embedded is not None else [])
        cpu0 = cpu_seconds(roots)
        t0 = time.time()
        sub = client.submit({**NOOP, "num_samples": sessions})
        status = client.wait(sub["task_id"], timeout=900, poll=0.5)  # the rate comes from the timings
        wall = max(s["timings"]["completed_start"] for s in status["sessions"]) - t0
        cpu = cpu_by_role(stack, cpu0, cpu_seconds(roots))
    finally:
        stack.stop()
    done = [s for s in status["sessions"] if s["state"] == "COMPLETED"]
    if len(done) != sessions:
        raise SystemExit(f"{label}: {sessions - len(done)} sessions did not complete: "
                         f"{[s for s in status['sessions'] if s['state'] != 'COMPLETED'][:2]}")
    timings = [s["timings"] for s in done]
    latency = sorted(t["completed_start"] - t.get("initializing_start", t["completed_start"]) for t in timings)
    return {"label": label, "wall": wall, "rate": sessions / wall,
            "p50": latency[len(latency) // 2], "p90": latency[int(len(latency) * 0.9)],
            "cpu_ms": {k: 1000 * v / sessions for k, v in sorted(cpu.items())}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=400)
    ap.add_argument("--pools", default="2,2,2", help="init,run,postrun pool processes")
    ap.add_argument("--baseline", default="main", help="git ref of the code to compare with ('' to skip)")
    ap.add_argument("--warmup", type=int, default=20)
    args = ap.parse_args()
    pools = tuple(int(n) for n in args.pools.split(","))
    assert len(pools) == 3

    from rich.console import Console
    from rich.table import Table

    console = Console()
    tmp = Path(tempfile.mkdtemp(prefix="polar-bench-dispatch-"))
    os.environ.setdefault("POLAR_HOME", str(tmp / "home"))
    os.environ.pop("POLAR_REDIS_URL", None)  # each run gets its own embedded Redis
    os.chdir(tmp)  # `python -m` puts the cwd first on sys.path: the children import what PYTHONPATH says
    rows = []
    if args.baseline:
        old = export_ref(args.baseline, tmp / "baseline")
        with console.status(f"{args.sessions} no-op sessions, code of {args.baseline}…"):
            rows.append(measure(f"before ({args.baseline})", tmp, pools, args.sessions, old, args.warmup))
    with console.status(f"{args.sessions} no-op sessions, this tree…"):
        rows.append(measure("after (this tree)", tmp, pools, args.sessions, None, args.warmup))
    table = Table(title=f"dispatch: {args.sessions} no-op sessions (shell `true`, local runtime) through "
                        f"init/run/postrun pools {args.pools}, {os.cpu_count()} cores")
    for col in ("code", "wall s", "sessions/s", "vs before", "init→done p50/p90 ms"):
        table.add_column(col, justify="left" if col == "code" else "right")
    for row in rows:
        table.add_row(row["label"], f"{row['wall']:.2f}", f"{row['rate']:.1f}",
                      f"{row['rate'] / rows[0]['rate']:.2f}×",
                      f"{row['p50'] * 1000:.0f} / {row['p90'] * 1000:.0f}")
    console.print(table)
    roles = sorted({k for row in rows for k in row["cpu_ms"]})
    cpu = Table(title="CPU ms per session by process (user + system; NAME+ = its children: pool workers, "
                      "gunicorn workers; the harness processes count in run+)")
    cpu.add_column("process")
    for row in rows:
        cpu.add_column(row["label"], justify="right")
    for role in (*roles, "total"):
        cpu.add_row(role, *(f"{(sum(row['cpu_ms'].values()) if role == 'total' else row['cpu_ms'].get(role, 0.0)):.1f}"
                            for row in rows))
    console.print(cpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
