"""The N-session run measured end to end, per Celery pool side by side (issue 36).

For each pool in --pools, a fresh stack on this host (`polar_mq.cli.up.launch`: embedded Redis, the
stand-in model server, gateway, API, the three stage pools), then N sessions of a cheap agent in
one task. The agent (bash + curl, the `shell` harness) sends the recorded requests of a real CLI
(default tests/replays/pi/openai_chat.json: two streamed ~6 KB chat calls with tools and a tool
result; --replay picks another openai_chat recording, e.g. qwen_code's ~78 KB ones) through
the gateway, and each body straight to the upstream right after, so every gateway call has a
paired direct call under the same load: added latency = through the gateway − direct.

Reported per pool: completed / lost (not terminal at the end) / duplicated (more than one
terminal state, or more captured calls than sent), time to finish, dispatch rate (harness starts
per second), gateway added latency p50/p99, Redis CPU (INFO cpu delta) per session and per call,
Redis memory (used_memory delta) per session, peak PSS of the run pool's processes and per slot.

    python bench/bench_soak.py [--sessions 1024] [--pools threads,prefork] [--run-slots N]
                               [--hold 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import subprocess
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from polar_mq import states
from polar_mq.cli import slots  # noqa: E402
from polar_mq.client import Client  # noqa: E402
from polar_mq.cli.embedded_redis import free_port  # noqa: E402
from polar_mq.store.core import connect  # noqa: E402
from polar_mq.store.pipeline import PipelineStore  # noqa: E402
from polar_mq.cli.up import launch, wait_http  # noqa: E402

REPLAY = ROOT / "tests" / "replays" / "pi" / "openai_chat.json"

# The bodies dir, latency file, upstream root and hold come in the env. The gateway and direct
# calls go in random order (neither always sees the other's aftermath). curl -f: a refused call
# fails the session. One line per call appended (O_APPEND, < PIPE_BUF: lines never interleave).
AGENT = r"""set -e
gw() { curl -sSf -o /dev/null -w '%{time_total}' -H "Authorization: Bearer $OPENAI_API_KEY" \
       -H 'Content-Type: application/json' --data-binary @"$1" "$OPENAI_BASE_URL/chat/completions"; }
up() { curl -sSf -o /dev/null -w '%{time_total}' -H 'Content-Type: application/json' \
       --data-binary @"$1" "$UPSTREAM/v1/chat/completions"; }
for f in "$BODIES"/*.json; do
  if [ $((RANDOM % 2)) = 0 ]; then g=$(gw "$f"); d=$(up "$f"); else d=$(up "$f"); g=$(gw "$f"); fi
  echo "$g $d" >> "$LATENCY"
done
sleep "$HOLD"
"""


def write_bodies(out: Path, replay: Path = REPLAY) -> int:
    data = json.loads(replay.read_text())
    calls = [r for r in data["requests"] if r.get("generation")]
    out.mkdir(parents=True, exist_ok=True)
    for i, r in enumerate(calls):
        # max_tokens as recorded (8000) leaves no room for the prompt in the stand-in's 8k context:
        # the gateway clamps it, the direct call would be refused. The answer is the same length.
        body = {**r["body"], "max_tokens": 512}
        (out / f"{i:02d}.json").write_text(json.dumps(body, separators=(",", ":")))
    return len(calls)


def pss_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def pool_pids(main_pid: int) -> list[int]:
    """The worker process of `polar-mq worker --stage run` and its pool children (prefork's forks
    share its cmdline); harnesses, its children too, are not the pool."""
    def cmd(pid: int) -> bytes:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return b""
    try:
        kids = [int(c) for c in Path(f"/proc/{main_pid}/task/{main_pid}/children").read_text().split()]
    except OSError:
        kids = []
    return [main_pid] + [k for k in kids if cmd(k) == cmd(main_pid)]


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def redis_info(r) -> tuple[float, int]:
    cpu = r.info("cpu")
    return float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]), int(r.info("memory")["used_memory"])


def soak(pool: str, n: int, run_slots: int | None, hold: float, tmp: Path, timeout: float,
         replay: Path = REPLAY) -> dict:
    h = slots.host()
    slots_n = run_slots or slots.concurrency_for("run", pool, h)
    init_n = slots.concurrency_for("init", pool, h) if pool != "prefork" else max(2, min(8, slots_n))
    post_n = slots.concurrency_for("postrun", pool, h)
    work = tmp / pool
    bodies = work / "bodies"
    calls_per_session = write_bodies(bodies, replay)
    latency = work / "latency.txt"
    latency.write_text("")
    os.environ["POLAR_LOG_DIR"] = str(work / "logs")
    os.environ["POLAR_SESSIONS_DIR"] = str(work / "sessions")
    os.environ["POLAR_RESULTS_DIR"] = str(work / "results")
    # The stand-in with a context that fits the recorded prompts (~20k tokens; its default is 8k).
    ms_port = free_port()
    model_server = subprocess.Popen([sys.executable, "-m", "polar_mq.dev.model_server", "--port", str(ms_port),
                                     "--max-model-len", "65536"], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, start_new_session=True)
    upstream = f"http://127.0.0.1:{ms_port}"
    try:
        wait_http(f"{upstream}/health", model_server)
        return _soak_on(pool, n, slots_n, init_n, post_n, h, bodies, calls_per_session, latency, hold,
                        timeout, work, upstream)
    finally:
        model_server.terminate()
        model_server.wait()


def _soak_on(pool: str, n: int, slots_n: int, init_n: int, post_n: int, h: slots.Host, bodies: Path,
             calls_per_session: int, latency: Path, hold: float, timeout: float, work: Path,
             upstream: str) -> dict:
    stack = launch(api_port=free_port(), gateway_port=free_port(), flower=False, upstreams=[upstream],
                   concurrency=(init_n, slots_n, post_n),
                   extra_env={"POLAR_CELERY_POOL": pool, "POLAR_READY_CAPACITY": str(max(8, slots_n // 2)),
                              "POLAR_TASK_LOG": "0", "POLAR_KEEP_WORKDIRS": "0"})
    try:
        run_proc = next(c.proc for c in stack.supervisor.children if c.name == "worker_run")
        r = connect(stack.redis_url)
        client = Client(stack.api_url, token=stack.token)
        time.sleep(2.0)  # the pools' first beats: run@node must be live before init prepares
        idle0, _ = redis_info(r)
        time.sleep(5.0)  # Redis CPU of an idle stack (beats, janitors, idle consumers): its floor
        cpu0, mem0 = redis_info(r)
        idle_rate = (cpu0 - idle0) / 5.0
        t0 = time.time()
        sub = client.submit({
            "instruction": "soak", "num_samples": n, "timeout_seconds": max(600, int(timeout)),
            "agent": {"harness": "shell", "model": "policy",
                      "options": {"command": ["bash", "-c", AGENT],
                                  "env": {"BODIES": str(bodies), "LATENCY": str(latency),
                                          "UPSTREAM": stack.upstreams[0], "HOLD": str(hold)}}},
            "runtime": {"backend": "local"}, "builder": {"strategy": "per_request"}})
        store = PipelineStore(r)
        peak_pss, peak_procs, stop = [0.0], [0], threading.Event()

        def sample() -> None:
            while not stop.wait(0.5):
                pids = pool_pids(run_proc.pid)
                peak_procs[0] = max(peak_procs[0], len(pids))
                peak_pss[0] = max(peak_pss[0], pss_mib(pids))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        # A slow poll: the status of N sessions is itself Redis work the run would not have.
        status = client.wait(sub["task_id"], timeout=timeout, poll=2.0)
        elapsed = time.time() - t0
        stop.set()
        sampler.join()
        cpu1, mem1 = redis_info(r)
        sessions = status["sessions"]
        recs = store.get_sessions([s["session_id"] for s in sessions])
        completed = sum(rec.state == states.COMPLETED for rec in recs)
        lost = n - sum(states.is_terminal(rec.state) for rec in recs)
        dup_terminal = sum(sum(h[0] in states.TERMINAL for h in rec.history) > 1 for rec in recs)
        dup_calls = 0
        calls_total = 0
        for rec in recs:
            traj = store.get_trajectory(rec.session_id)
            c = int((traj.stats or {}).get("calls", 0)) if traj is not None else 0
            calls_total += c
            dup_calls += c > calls_per_session
        starts = sorted(rec.timings.get("running_start", 0.0) for rec in recs if rec.timings.get("running_start"))
        pairs = [tuple(map(float, ln.split())) for ln in latency.read_text().splitlines() if ln.strip()]
        added = [(g - d) * 1000 for g, d in pairs]
        direct = [d * 1000 for _, d in pairs]
        return {
            "pool": pool, "sessions": n, "run_slots": slots_n, "init_slots": init_n, "postrun_slots": post_n,
            "host": h.describe(), "completed": completed, "lost": lost,
            "duplicated": dup_terminal + dup_calls, "time_to_finish_s": round(elapsed, 1),
            "sessions_per_s": round(n / elapsed, 2),
            "dispatch_rate_per_s": round((len(starts) - 1) / (starts[-1] - starts[0]), 1) if len(starts) > 1 else None,
            "calls_captured": calls_total, "calls_per_session": calls_per_session,
            "gateway_added_ms_p50": round(pct(added, .5), 1), "gateway_added_ms_p99": round(pct(added, .99), 1),
            "gateway_ms_p50": round(pct([g * 1000 for g, _ in pairs], .5), 1),
            "gateway_ms_p99": round(pct([g * 1000 for g, _ in pairs], .99), 1),
            "upstream_direct_ms_p50": round(pct(direct, .5), 1),
            "upstream_direct_ms_p99": round(pct(direct, .99), 1),
            "redis_cpu_s": round(cpu1 - cpu0, 2), "redis_idle_cpu_ms_per_s": round(idle_rate * 1000, 2),
            "redis_cpu_ms_per_session": round((cpu1 - cpu0) * 1000 / n, 2),
            "redis_cpu_ms_per_session_above_idle": round((cpu1 - cpu0 - idle_rate * elapsed) * 1000 / n, 2),
            "redis_cpu_ms_per_call": round((cpu1 - cpu0) * 1000 / max(1, calls_total), 3),
            "redis_mem_delta_mib": round((mem1 - mem0) / 2**20, 1),
            "redis_bytes_per_session": int((mem1 - mem0) / n),
            "run_pool_processes": peak_procs[0], "run_pool_pss_mib": round(peak_pss[0], 1),
            "run_pool_pss_kib_per_slot": int(peak_pss[0] * 1024 / slots_n),
            "first_errors": sorted({str(rec.error)[:200] for rec in recs if rec.state != states.COMPLETED})[:3],
        }
    finally:
        stack.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=1024)
    ap.add_argument("--pools", default="threads,prefork", help="comma-separated Celery pools, one stack each")
    ap.add_argument("--run-slots", type=int, default=0,
                    help="run slots of every pool (default: each pool's own host-sized default, slots.py)")
    ap.add_argument("--hold", type=float, default=2.0, help="seconds each agent holds its slot after its calls")
    ap.add_argument("--timeout", type=float, default=3600.0)
    ap.add_argument("--replay", type=Path, default=REPLAY, help="a recorded openai_chat replay (tests/replays)")
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="polar-bench-soak-"))
    results = []
    for pool in [p.strip() for p in args.pools.split(",") if p.strip()]:
        res = soak(pool, args.sessions, args.run_slots or None, args.hold, tmp, args.timeout, args.replay)
        print(json.dumps(res), flush=True)
        results.append(res)
    keys = list(results[0])
    width = max(len(k) for k in keys)
    print(f"\n{'':{width}}  " + "  ".join(f"{r['pool']:>14}" for r in results))
    for k in keys[1:]:
        print(f"{k:{width}}  " + "  ".join(f"{str(r[k]):>14}" for r in results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0 if all(r["lost"] == 0 and r["duplicated"] == 0 and r["completed"] == r["sessions"]
                    for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
