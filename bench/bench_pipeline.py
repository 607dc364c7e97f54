"""Pipeline benchmarks on one machine (real Redis, API, gateway and Celery pools via `launch`).

1. Run-slot utilisation in a simulated workload: every session needs an init phase (prepare,
   Y seconds) and a run phase (harness, X seconds), both jittered, init ≈ run. With the READY
   buffer (capacity = run slots, init pool 2× the run pool), init happens in the init pool while
   run slots run other sessions; the naive baseline does both in the run slot. Busy = the run
   work sum(X) / (slots × (last run end − first run start)), from the sessions' own timings.
2. Dispatch throughput: no-op sessions (`true`) through init → run → postrun, sessions/s.

    python bench/bench_pipeline.py [--sessions 64] [--slots 4] [--init-workers 8] [--noop 200]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from polar_mq.client import Client  # noqa: E402
from polar_mq.cli.embedded_redis import free_port  # noqa: E402
from polar_mq.cli.up import launch  # noqa: E402


def run_task(client: Client, body: dict, timeout: float) -> tuple[float, dict]:
    t0 = time.perf_counter()
    sub = client.submit(body)
    status = client.wait(sub["task_id"], timeout=timeout, poll=0.1)
    elapsed = time.perf_counter() - t0
    bad = [s for s in status["sessions"] if s["state"] != "COMPLETED"]
    if bad:
        raise SystemExit(f"{len(bad)} sessions did not complete: {bad[:2]}")
    return elapsed, status


def run_window(statuses: list[dict]) -> float:
    """Seconds from the first harness start to the last harness end over all sessions."""
    timings = [s["timings"] for st in statuses for s in st["sessions"]]
    return max(t["running_end"] for t in timings) - min(t["running_start"] for t in timings)


def handoff_gaps(statuses: list[dict], slots: int) -> list[float]:
    """Seconds a freed run slot stays empty: the k-th harness end is followed (FIFO) by the
    (k + slots)-th harness start."""
    timings = [s["timings"] for st in statuses for s in st["sessions"]]
    ends = sorted(t["running_end"] for t in timings)
    starts = sorted(t["running_start"] for t in timings)
    return [max(0.0, s - e) for e, s in zip(ends, starts[slots:])]


def run_overheads(statuses: list[dict], runs: list[float]) -> list[float]:
    """Seconds each session held its run slot beyond its own run work (harness start, exit,
    state moves): the k-th task ran the k-th workload."""
    return sorted(max(0.0, s["timings"]["running_end"] - s["timings"]["running_start"] - x)
                  for st, x in zip(statuses, runs) for s in st["sessions"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--init-workers", type=int, default=0, help="init pool (default 2 × slots)")
    ap.add_argument("--slots", type=int, default=4, help="run slots (run pool concurrency)")
    ap.add_argument("--mean", type=float, default=1.0, help="mean seconds of init and of run")
    ap.add_argument("--noop", type=int, default=200, help="no-op sessions for the throughput test")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--backend", default="local",
                    help="runtime of every session (local: the pipeline's own overhead; bwrap adds a sandbox "
                         "start to every prepare step and harness run)")
    args = ap.parse_args()

    from rich.console import Console
    from rich.table import Table

    console = Console()
    rng = random.Random(args.seed)
    jitter = lambda: round(rng.uniform(0.5, 1.5) * args.mean, 2)  # noqa: E731
    work = [(jitter(), jitter()) for _ in range(args.sessions)]  # (init Y, run X)
    run_total = sum(x for _, x in work)
    tmp = Path(tempfile.mkdtemp(prefix="polar-bench-pipeline-"))
    os.environ.setdefault("POLAR_LOG_DIR", str(tmp / "logs"))
    os.environ["POLAR_SESSIONS_DIR"] = str(tmp / "sessions")
    os.environ["POLAR_RESULTS_DIR"] = str(tmp / "results")
    rows = []
    with console.status("starting the stack…"):
        stack = launch(api_port=free_port(), gateway_port=free_port(), flower=False,
                       concurrency=(args.init_workers or 2 * args.slots, args.slots, 2),
                       extra_env={"POLAR_READY_CAPACITY": str(args.slots),
                                  "POLAR_ALLOW_LOCAL_EXEC": "1"})  # the bench's own `sleep` prepare steps
    try:
        client = Client(stack.api_url)
        # READY buffer: each session is its own task so per-session init/run times can differ.
        with console.status("READY buffer workload…"):
            t0 = time.perf_counter()
            subs = [client.submit({"instruction": "bench", "timeout_seconds": 600,
                                   "agent": {"harness": "shell", "options": {"command": f"sleep {x}"}},
                                   "runtime": {"backend": args.backend, "prepare": [{"exec": f"sleep {y}"}]},
                                   "builder": {"strategy": "per_request"}}) for y, x in work]
            buffered_status = [client.wait(sub["task_id"], timeout=600, poll=0.1) for sub in subs]
            buffered = time.perf_counter() - t0
        with console.status("naive one-task-per-session workload…"):
            t0 = time.perf_counter()
            subs = [client.submit({"instruction": "bench", "timeout_seconds": 600,
                                   "agent": {"harness": "shell", "options": {"command": f"sleep {y}; sleep {x}"}},
                                   "runtime": {"backend": args.backend},
                                   "builder": {"strategy": "per_request"}}) for y, x in work]
            naive_status = [client.wait(sub["task_id"], timeout=600, poll=0.1) for sub in subs]
            naive = time.perf_counter() - t0
        ideal = max(run_total / args.slots, max(y + x for y, x in work))
        for name, span, statuses in (("READY buffer (init pool + run slots)", buffered, buffered_status),
                                     ("naive (init inside the run slot)", naive, naive_status)):
            gaps = sorted(handoff_gaps(statuses, args.slots)) or [0.0]
            over = run_overheads(statuses, [x for _, x in work] if statuses is buffered_status
                                 else [y + x for y, x in work])
            rows.append((name, span, run_total / (args.slots * run_window(statuses)),
                         gaps[len(gaps) // 2], gaps[int(len(gaps) * 0.9)], over[len(over) // 2]))
        with console.status(f"{args.noop} no-op sessions…"):
            elapsed, _ = run_task(client, {"instruction": "noop", "num_samples": args.noop, "timeout_seconds": 600,
                                           "agent": {"harness": "shell", "options": {"command": "true"}},
                                           "runtime": {"backend": args.backend},
                                           "builder": {"strategy": "per_request"}}, timeout=900)
    finally:
        stack.stop()

    table = Table(title=f"run-slot utilisation: {args.sessions} sessions, {args.slots} run slots, "
                        f"init and run ~U(0.5,1.5)×{args.mean}s, {args.backend} runtime ({os.cpu_count()} cores)")
    for col in ("mode", "makespan s", "run slots busy", "vs naive", "slot hand-off p50/p90 ms",
                "in-slot overhead p50 ms"):
        table.add_column(col, justify="left" if col == "mode" else "right")
    for name, span, util, p50, p90, over in rows:
        table.add_row(name, f"{span:.2f}", f"{util:.1%}", f"{util / rows[1][2]:.2f}× busier" if span != rows[1][1]
                      else "1.00×", f"{p50 * 1000:.0f} / {p90 * 1000:.0f}", f"{over * 1000:.0f}")
    console.print(table)
    console.print(f"lower bound on makespan (run work / slots): {ideal:.2f} s")
    console.print(f"dispatch throughput: {args.noop} no-op sessions through init → run → postrun in "
                  f"{elapsed:.1f} s = [bold]{args.noop / elapsed:.1f} sessions/s[/]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
