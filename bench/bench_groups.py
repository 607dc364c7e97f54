"""Groups for trainers: hand-out throughput and the latency from "last session finished" to "the
trainer has the group", against polling (task status, then fetch results).


Real parts: a private redis-server, the rollout API as a real process (`polar-mq api`, gunicorn),
the gateway and the stand-in model. The trajectory in every session is a real one: the recorded
Claude Code session in tests/replays (claude_code/anthropic.json) replayed through the gateway
and merged by prefix_merging; each group has `--samples` copies of it.

1. Throughput: `--groups` finished groups; the groups API (`next` + `ack` per group as JSON and
   as msgpack, and `next` with limit=8 + 8 acks) vs. the polling baseline (`GET /v1/tasks/<id>`
   + `GET .../results`, JSON).
2. Latency: a trainer long-polls `GET /v1/groups/next?wait=30` while the last session of a task
   is moved to COMPLETED through `PipelineStore.transition` (what postrun does); vs. the baseline
   `Client.wait(poll=1.0)` then `results`. p50 / p95 over `--reps` tasks.

    python bench/bench_groups.py [--groups 200] [--samples 8] [--reps 30]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import requests  # noqa: E402

from polar_mq import states  # noqa: E402
from polar_mq.client import Client  # noqa: E402
from polar_mq.cli.embedded_redis import free_port, start_embedded  # noqa: E402
from polar_mq.model import Trajectory  # noqa: E402
from polar_mq.store.pipeline import PipelineStore  # noqa: E402
from polar_mq.store.core import connect  # noqa: E402
from polar_mq.taskspec import parse_task  # noqa: E402
from polar_mq.auth import auth_headers  # noqa: E402
from polar_mq.cli.up import wait_http  # noqa: E402

REPLAY = ROOT / "tests" / "replays" / "claude_code" / "anthropic.json"
PATH = [states.INITIALIZING, states.READY, states.RUNNING, states.POST_RUN, states.BUILDING, states.EVALUATING]


def spawn(args: list[str], url: str, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    import os

    proc = subprocess.Popen(args, stdout=open(log, "wb"), stderr=subprocess.STDOUT, cwd=ROOT,
                            env={**os.environ, **(env or {})}, start_new_session=True)
    wait_http(url, proc, 90)
    return proc


def real_trajectory(gateway: str) -> dict:
    """The recorded Claude Code session replayed through the gateway → one merged trajectory."""
    sess = requests.post(f"{gateway}/sessions", headers=auth_headers(), json={}, timeout=10).json()
    key = sess["key"]
    for req in json.loads(REPLAY.read_text())["requests"]:
        if not req.get("generation"):
            continue
        headers = {k: v.replace("REPLAY_KEY", key) for k, v in req["headers"].items()}
        body = json.dumps(req["body"]).replace("REPLAY_KEY", key)
        requests.post(gateway + req["path"].replace("REPLAY_KEY", key), data=body, headers=headers,
                      timeout=60).content
    return requests.get(f"{gateway}/sessions/{sess['session_id']}/trajectory", headers=auth_headers(),
                        params={"builder": "prefix_merging"}, timeout=30).json()


def make_task(store: PipelineStore, task_id: str, samples: int, traj: dict, *, finish_last: bool = True) -> list[str]:
    task = parse_task({"task_id": task_id, "instruction": "bench", "num_samples": samples,
                       "agent": {"harness": "shell", "options": {"command": "true"}},
                       "metadata": {"policy_version": 1}})
    sids, _ = store.create_task(task)
    for i, sid in enumerate(sids):
        t = Trajectory.from_dict({**traj, "session_id": sid, "task_id": task_id, "reward": float(i % 2)})
        store.save_trajectory(t)
        for st in PATH:
            store.transition(sid, st)
        if finish_last or i < len(sids) - 1:
            store.transition(sid, states.COMPLETED, reward=float(i % 2))
    return sids


def throughput_groups(client: Client, n: int, batch: int, msgpack_body: bool = True) -> float:
    t0 = time.perf_counter()
    got = 0
    while got < n:
        groups = client.next_groups(limit=batch, wait=0, lease=300, msgpack_body=msgpack_body)
        if not groups:
            break
        for g in groups:
            client.ack_group(g["task_id"])
        got += len(groups)
    return got / (time.perf_counter() - t0)


def throughput_polling(client: Client, task_ids: list[str]) -> float:
    t0 = time.perf_counter()
    for tid in task_ids:
        assert client.status(tid)["state"] == "done"
        client.results(tid)
    return len(task_ids) / (time.perf_counter() - t0)


def latency_groups(client: Client, store: PipelineStore, traj: dict, samples: int, reps: int,
                   msgpack_body: bool = True) -> list[float]:
    out = []
    for i in range(reps):
        sids = make_task(store, f"lat-g{int(msgpack_body)}-{i}", samples, traj, finish_last=False)
        got: dict[str, float] = {}

        def trainer():
            [g] = client.next_groups(limit=1, wait=30, lease=300, msgpack_body=msgpack_body)
            got["t"] = time.time()
            client.ack_group(g["task_id"])

        th = threading.Thread(target=trainer)
        th.start()
        time.sleep(0.05 + (i % 5) * 0.037)  # the trainer is waiting; finish at varied phases
        t0 = time.time()
        store.transition(sids[-1], states.COMPLETED, reward=1.0)
        th.join(30)
        out.append(got["t"] - t0)
    return out


def latency_polling(client: Client, store: PipelineStore, traj: dict, samples: int, reps: int) -> list[float]:
    out = []
    for i in range(reps):
        tid = f"lat-p-{i}"
        sids = make_task(store, tid, samples, traj, finish_last=False)
        got: dict[str, float] = {}

        def trainer():
            client.wait(tid, timeout=30, poll=1.0)
            client.results(tid)
            got["t"] = time.time()

        th = threading.Thread(target=trainer)
        th.start()
        time.sleep(0.05 + (i % 5) * 0.237)
        t0 = time.time()
        store.transition(sids[-1], states.COMPLETED, reward=1.0)
        th.join(30)
        out.append(got["t"] - t0)
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, default=200)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="polar-bench-groups-"))
    redis_server = start_embedded()
    procs: list[subprocess.Popen] = []
    try:
        ms_port, gw_port, api_port = free_port(), free_port(), free_port()
        py = sys.executable
        procs.append(spawn([py, "-m", "polar_mq.dev.model_server", "--port", str(ms_port), "--max-model-len", "65536"],
                           f"http://127.0.0.1:{ms_port}/health", tmp / "ms.log"))
        procs.append(spawn([py, "-m", "polar_mq.cli", "gateway", "--port", str(gw_port), "--redis", redis_server.url,
                            "--upstream", f"http://127.0.0.1:{ms_port}", "--workers", "1"],
                           f"http://127.0.0.1:{gw_port}/health", tmp / "gw.log",
                           env={"POLAR_SPOOL_DIR": str(tmp / "spool")}))
        procs.append(spawn([py, "-m", "polar_mq.cli", "api", "--port", str(api_port), "--redis", redis_server.url,
                            "--workers", "1"], f"http://127.0.0.1:{api_port}/health", tmp / "api.log",
                           env={"POLAR_API_TOKEN": ""}))
        traj = real_trajectory(f"http://127.0.0.1:{gw_port}")
        tokens = sum(len(t["prompt_ids"]) + len(t["response_ids"]) for t in traj["traces"])
        store = PipelineStore(connect(redis_server.url))
        client = Client(f"http://127.0.0.1:{api_port}", token="")
        group_bytes = len(json.dumps(traj)) * args.samples
        print(f"trajectory: replayed Claude Code session, {len(traj['traces'])} trace(s), {tokens} tokens; "
              f"group = {args.samples} trajectories, ~{group_bytes / 1e6:.2f} MB JSON", flush=True)

        ids = [f"thr-{i}" for i in range(args.groups)]
        for tid in ids:
            make_task(store, tid, args.samples, traj)
        poll = throughput_polling(client, ids)
        one_json = throughput_groups(client, args.groups, 1, msgpack_body=False)
        runs = {}
        for name, batch in (("one", 1), ("batched", 8)):  # a fresh set per run (the last one is acked)
            for tid in ids:
                make_task(store, f"{tid}-{name}", args.samples, traj)
            runs[name] = throughput_groups(client, args.groups, batch)
        one, batched = runs["one"], runs["batched"]

        lat_gj = latency_groups(client, store, traj, args.samples, args.reps, msgpack_body=False)
        lat_g = latency_groups(client, store, traj, args.samples, args.reps)
        lat_p = latency_polling(client, store, traj, args.samples, args.reps)
        print()
        print(f"{'hand-out throughput (groups/s)':<44}{'value':>10}{'vs polling':>12}")
        print(f"{'  polling: status + results per task':<44}{poll:>10.1f}{1.0:>11.2f}x")
        print(f"{'  groups: next(limit=1) + ack, JSON':<44}{one_json:>10.1f}{one_json / poll:>11.2f}x")
        print(f"{'  groups: next(limit=1) + ack, msgpack':<44}{one:>10.1f}{one / poll:>11.2f}x")
        print(f"{'  groups: next(limit=8) + 8 acks, msgpack':<44}{batched:>10.1f}{batched / poll:>11.2f}x")
        print()
        print(f"{'last session finished -> trainer has group':<44}{'p50 ms':>10}{'p95 ms':>10}{'p50 ratio':>11}")
        gp50, pp50 = statistics.median(lat_g) * 1000, statistics.median(lat_p) * 1000
        print(f"{'  polling: Client.wait(poll=1.0) + results':<44}{pp50:>10.1f}{pct(lat_p, 0.95) * 1000:>10.1f}"
              f"{1.0:>10.2f}x")
        gj50 = statistics.median(lat_gj) * 1000
        print(f"{'  groups: next?wait=30 (long poll), JSON':<44}{gj50:>10.1f}{pct(lat_gj, 0.95) * 1000:>10.1f}"
              f"{gj50 / pp50:>10.3f}x")
        print(f"{'  groups: next?wait=30 (long poll), msgpack':<44}{gp50:>10.1f}{pct(lat_g, 0.95) * 1000:>10.1f}"
              f"{gp50 / pp50:>10.3f}x")
        print(f"\n({args.groups} groups, {args.samples} samples each, {args.reps} latency reps; logs in {tmp})")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        redis_server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
