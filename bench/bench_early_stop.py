"""Time to a usable group, without and with early stop, over sessions of very different lengths.

Each group (task) has `--samples` sessions; all but one finish quickly, one straggles (session
lengths drawn from a seeded distribution: quick ones uniform in [0.3, 1.5] s, the straggler in
[--straggler-min, --straggler-max] s). Groups run one after the other through a real stack
(`polar-mq up`'s roles: API, gateway, stand-in model, init/run/postrun pools), and a group's time
is from its submit to `GET /v1/groups/next` handing it out. "before": no early stop (the group
waits for its straggler); "after": `early_stop_min_usable_sessions` = samples - 1. Both modes run
the same lengths (same seed). Nothing lost is checked on every group: one trajectory per session,
the cancelled ones labelled `metadata.early_stopped`.

    python bench/bench_early_stop.py [--groups 20] [--samples 4] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from polar_mq.client import Client  # noqa: E402
from polar_mq.cli.embedded_redis import free_port  # noqa: E402
from polar_mq.cli.up import launch  # noqa: E402


def lengths(groups: int, samples: int, lo: float, hi: float, seed: int) -> list[list[float]]:
    rng = random.Random(seed)
    out = []
    for _ in range(groups):
        row = [round(rng.uniform(0.3, 1.5), 2) for _ in range(samples - 1)] + [round(rng.uniform(lo, hi), 2)]
        rng.shuffle(row)
        out.append(row)
    return out


def task(task_id: str, durations: list[float], early_stop: int | None) -> dict:
    cases = " ".join(f"*-{i}-*) sleep {d};;" for i, d in enumerate(durations))
    body = {"task_id": task_id, "instruction": "sleep a while", "num_samples": len(durations),
            "timeout_seconds": 600,
            "agent": {"harness": "shell", "options": {"command": f'case "$POLAR_SESSION_ID" in {cases} esac'}},
            "runtime": {"backend": "local"}, "builder": {"strategy": "per_request"}}
    if early_stop:
        body["early_stop_min_usable_sessions"] = early_stop
    return body


def run_mode(client: Client, label: str, plan: list[list[float]], early_stop: int | None) -> list[float]:
    times = []
    for g, durations in enumerate(plan):
        tid = f"es-bench-{label}-{g}"
        t0 = time.time()
        client.submit(task(tid, durations, early_stop))
        while True:
            groups = client.next_groups(limit=1, wait=30, lease=600)
            if groups:
                break
        group = groups[0]
        times.append(time.time() - t0)
        assert group["task_id"] == tid, group["task_id"]
        assert len(group["trajectories"]) == len(durations), "a session's trajectory is missing"
        stopped = [t for t in group["trajectories"] if t["metadata"].get("early_stopped")]
        assert len(stopped) == group.get("early_stopped", 0)
        assert all(t["status"] == "ERROR" and t["error"] == "cancelled" for t in stopped)
        usable = [s for s in group["sessions"] if s["state"] != "ERROR"]
        assert len(usable) >= (early_stop or len(durations)), group["sessions"]
        client.ack_group(tid)
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, default=20)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--straggler-min", type=float, default=5.0)
    ap.add_argument("--straggler-max", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    plan = lengths(args.groups, args.samples, args.straggler_min, args.straggler_max, args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="polar-bench-early-stop-"))
    os.environ.setdefault("POLAR_HOME", str(tmp / "home"))
    os.environ.pop("POLAR_REDIS_URL", None)
    os.environ["POLAR_LOG_DIR"] = str(tmp / "logs")
    stack = launch(api_port=free_port(), gateway_port=free_port(), flower=False,
                   concurrency=(2, args.samples, 2),
                   extra_env={"POLAR_SESSIONS_DIR": str(tmp / "sessions"), "POLAR_RESULTS_DIR": str(tmp / "results"),
                              "POLAR_READY_CAPACITY": str(args.samples)})
    try:
        client = Client(stack.api_url, token=stack.token)
        run_mode(client, "warm", plan[:1], None)
        rows = [("before (no early stop)", run_mode(client, "before", plan, None)),
                (f"after (early stop {args.samples - 1} of {args.samples})",
                 run_mode(client, "after", plan, args.samples - 1))]
    finally:
        stack.stop()
    print(f"time to a usable group: {args.groups} groups of {args.samples} sessions, one straggler each "
          f"({args.straggler_min:g}-{args.straggler_max:g} s, others 0.3-1.5 s), seed {args.seed}, "
          f"{os.cpu_count()} cores")
    print(f"{'mode':<32} {'median s':>9} {'p90 s':>7} {'mean s':>7}")
    for label, times in rows:
        ordered = sorted(times)
        p90 = ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))]
        print(f"{label:<32} {statistics.median(times):>9.2f} {p90:>7.2f} {statistics.mean(times):>7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
