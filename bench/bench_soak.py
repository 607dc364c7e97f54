"""The N-session run measured end to end, per Celery pool side by side (issue 36).

For each pool in --pools, a fresh deployment, then N sessions of a cheap agent in one task:

- `--hosts 0` (default): one host, `polar_mq.cli.up.launch` (embedded Redis, gateway, API, the
  three stage pools) and a stand-in model server;
- `--hosts H` (root): a hub and H worker hosts as network namespaces on a bridge
  (tests/support/netns.py, as tests/pipeline/test_many_hosts.py): the hub runs Redis (no AOF, as
  `polar-mq up`), the stand-in and the gateway (its default workers); each host runs the three
  stage pools with its own sessions dir and run queue, each sized as `polar-mq worker` sizes them
  on this machine unless --run-slots says otherwise. Every call crosses the bridge.

The agent (bash + curl, the `shell` harness) sends the recorded requests of a real CLI (default
tests/replays/pi/openai_chat.json: two streamed ~6 KB chat calls with tools and a tool result;
--replay picks another openai_chat recording) through the gateway, and each body straight to the
upstream right after or before (random order). The gateway's added latency is per call: the
client's time (curl) minus the upstream's part as the gateway timed it (the capture record's
latency_ms); through the gateway − direct is reported too. Then the agent holds its slot --hold
seconds. curl -f: a refused call fails the session.

Reported per pool (one column each): completed / lost (not terminal at the end) / duplicated
(more than one terminal state, or more captured calls than sent), time to finish, dispatch rate
(harness starts per second), peak sessions RUNNING at once, gateway added latency p50/p99,
Redis CPU (INFO cpu delta, the idle deployment's rate measured first) per session and per call,
Redis commands per session and where its CPU goes (INFO commandstats), Redis memory per session,
peak PSS of the run pools (tests/support/procmem.py) and per slot, CPU per session of each role,
the load average before and after (the machine may be shared).

    python bench/bench_soak.py [--hosts H] [--sessions 1024] [--pools threads,prefork]
                               [--run-slots N] [--prefork-run-slots N] [--hold 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from polar_mq import states  # noqa: E402
from polar_mq.cli import slots  # noqa: E402
from polar_mq.cli.embedded_redis import free_port  # noqa: E402
from polar_mq.cli.up import launch, wait_http  # noqa: E402
from polar_mq.store.core import GatewayStore, connect  # noqa: E402
from polar_mq.store.pipeline import PipelineStore  # noqa: E402
from tests.support.procmem import pool_pids, pss_mib  # noqa: E402

REPLAY = ROOT / "tests" / "replays" / "pi" / "openai_chat.json"
CLK = os.sysconf("SC_CLK_TCK")

# The bodies dir, latency file, upstream root and hold come in the env. The gateway and direct
# calls go in random order (neither always sees the other's aftermath). curl -f: a refused call
# fails the session. One line per call appended (O_APPEND, < PIPE_BUF: lines never interleave).
AGENT = r"""set -e
gw() { curl -sSf -o /dev/null -w '%{time_total}' -H "Authorization: Bearer $OPENAI_API_KEY" \
       -H 'Content-Type: application/json' --data-binary @"$1" "$OPENAI_BASE_URL/chat/completions"; }
up() { curl -sSf -o /dev/null -w '%{time_total}' -H 'Content-Type: application/json' \
       --data-binary @"$1" "$UPSTREAM/v1/chat/completions"; }
i=0
for f in "$BODIES"/*.json; do
  if [ $((RANDOM % 2)) = 0 ]; then g=$(gw "$f"); d=$(up "$f"); else d=$(up "$f"); g=$(gw "$f"); fi
  echo "$POLAR_SESSION_ID $i $g $d" >> "$LATENCY"
  i=$((i + 1))
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


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def cpu_s(pids: list[int]) -> float:
    """utime + stime of these processes (all their threads; not their reaped children)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            pass
    return total / CLK


def tree(pid: int) -> list[int]:
    """pid and its live descendants (a gunicorn master and its workers)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for t in os.listdir(f"/proc/{p}/task"):
                todo += [int(c) for c in Path(f"/proc/{p}/task/{t}/children").read_text().split()]
        except OSError:
            pass
    return out


def peak_overlap(spans: list[tuple[float, float]]) -> int:
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    now = peak = 0
    for _, d in events:
        now += d
        peak = max(peak, now)
    return peak


def mem_available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def redis_cpu(r) -> float:
    cpu = r.info("cpu")
    return float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])


def commandstats(r) -> dict[str, tuple[int, int]]:
    return {k.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"])) for k, v in r.info("commandstats").items()}


@dataclass
class Deployment:
    """What a soak needs of a running deployment, whichever way it was started."""
    redis_url: str
    upstream: str  # the stand-in as the harnesses reach it
    submit: Callable[[dict[str, Any]], list[str]]
    run_pids: Callable[[], list[int]]  # every run pool's processes now
    roles: dict[str, Callable[[], list[int]]]  # role -> its processes now (CPU per role)
    slots: dict[str, int]  # stage -> slots in all
    hosts: int
    stop: Callable[[], None]
    notes: list[str] = field(default_factory=list)


def _single_host(pool: str, slots_n: int, work: Path, model_args: list[str]) -> Deployment:
    h = slots.host()
    init_n = slots.concurrency_for("init", pool, h) if pool != "prefork" else max(2, min(8, slots_n))
    post_n = slots.concurrency_for("postrun", pool, h)
    os.environ["POLAR_LOG_DIR"] = str(work / "logs")
    os.environ["POLAR_SESSIONS_DIR"] = str(work / "sessions")
    os.environ["POLAR_RESULTS_DIR"] = str(work / "results")
    ms_port = free_port()
    model = subprocess.Popen([sys.executable, "-m", "polar_mq.dev.model_server", "--port", str(ms_port),
                              "--max-model-len", "65536", *model_args], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    upstream = f"http://127.0.0.1:{ms_port}"
    try:
        wait_http(f"{upstream}/health", model)
        stack = launch(api_port=free_port(), gateway_port=free_port(), flower=False, upstreams=[upstream],
                       concurrency=(init_n, slots_n, post_n),
                       extra_env={"POLAR_CELERY_POOL": pool, "POLAR_READY_CAPACITY": str(max(8, slots_n // 2)),
                                  "POLAR_TASK_LOG": "0", "POLAR_KEEP_WORKDIRS": "0"})
    except BaseException:
        model.terminate()
        model.wait()
        raise
    from polar_mq.client import Client

    client = Client(stack.api_url, token=stack.token)
    store = PipelineStore(connect(stack.redis_url))

    def submit(body: dict[str, Any]) -> list[str]:
        return store.session_ids(client.submit(body)["task_id"])

    children = {c.name: c.proc.pid for c in stack.supervisor.children}

    def role(name: str) -> Callable[[], list[int]]:
        return lambda: tree(children[name]) if name in children else []

    def stop() -> None:
        stack.stop()
        model.terminate()
        model.wait()

    return Deployment(
        redis_url=stack.redis_url, upstream=upstream, submit=submit,
        run_pids=lambda: pool_pids(children["worker_run"]),
        roles={"gateway": role("gateway"), "api": role("api"), "model": lambda: [model.pid],
               **{f"worker_{s}": (lambda s=s: pool_pids(children[f"worker_{s}"])) for s in ("init", "run", "postrun")}},
        slots={"init": init_n, "run": slots_n, "postrun": post_n}, hosts=1, stop=stop)


def _many_hosts(pool: str, hosts: int, run_slots: int | None, work: Path, model_args: list[str]) -> Deployment:
    from tests.support.netns import Cluster, netns_unavailable

    why = netns_unavailable()
    if why:
        raise SystemExit(f"bench_soak --hosts: {why}")
    from polar_mq.settings import PipelineSettings
    from polar_mq.tasks.app.celery import make_celery
    from polar_mq.tasks.app.routing import INIT_TASK, STAGE_QUEUE
    from polar_mq.taskspec import parse_task

    h = slots.host()
    run_n = run_slots or slots.concurrency_for("run", pool, h)
    init_n = slots.concurrency_for("init", pool, h) if pool != "prefork" else max(2, min(8, run_n))
    post_n = slots.concurrency_for("postrun", pool, h)
    defaults = PipelineSettings()
    # A subnet of its own: a test's cluster (10.77.0.0/24) may be up on this machine at the same time.
    cluster = Cluster(base=work, subnet=f"10.{random.randint(180, 250)}.{random.randint(0, 255)}",
                      model_host="0.0.0.0", appendfsync="no", gateway_workers=None,
                      lease_ttl=defaults.lease_ttl)
    names = [f"w{i}" for i in range(hosts)]
    try:
        cluster.build_network(names)
        cluster.start_hub(tuple(model_args))
        wait_http(f"{cluster.model_url}/health", cluster.hub_procs["model"], 60)
        # Production settings, not the fault tests' short lease and janitor period.
        env = {"POLAR_CELERY_POOL": pool, "POLAR_JANITOR_INTERVAL": str(defaults.janitor_interval),
               "POLAR_MAX_ATTEMPTS": str(defaults.max_attempts), "POLAR_READY_CAPACITY": str(max(8, run_n // 2)),
               "POLAR_TASK_EVENTS": "0", "POLAR_TASK_LOG": "0", "POLAR_KEEP_WORKDIRS": "0",
               "POLAR_LOG_LEVEL": "WARNING"}
        for name in names:
            cluster.start_pools(name, init=init_n, run=run_n, postrun=post_n, env=env)
        cluster.wait_nodes(names, timeout=120)
        # READY capacity is cluster-wide: each host's init keeps about half its run pool in stock.
        cluster.store.set_ready_capacity(max(8, run_n // 2) * hosts)
    except BaseException:
        cluster.stop()
        raise
    store = cluster.store
    app = make_celery(PipelineSettings(redis_url=cluster.redis_url))

    def submit(body: dict[str, Any]) -> list[str]:
        sids, _ = store.create_task(parse_task(body))
        with app.producer_or_acquire() as producer, producer.batch():  # as the API: one write
            for sid in sids:
                app.send_task(INIT_TASK, args=[sid], queue=STAGE_QUEUE[INIT_TASK], producer=producer)
        return sids

    def stage(i: int) -> Callable[[], list[int]]:
        return lambda: [p for host in cluster.hosts.values() if len(host.procs) > i
                        for p in pool_pids(host.procs[i].pid)]

    return Deployment(
        redis_url=cluster.redis_url, upstream=cluster.model_url, submit=submit, run_pids=stage(1),
        roles={"gateway": lambda: tree(cluster.hub_procs["gateway"].pid),
               "model": lambda: [cluster.hub_procs["model"].pid],
               "worker_init": stage(0), "worker_run": stage(1), "worker_postrun": stage(2)},
        slots={"init": init_n * hosts, "run": run_n * hosts, "postrun": post_n * hosts}, hosts=hosts,
        stop=cluster.stop, notes=[f"bridge {cluster.subnet}.0/24"])


def soak(pool: str, n: int, run_slots: int | None, hold: float, tmp: Path, timeout: float,
         replay: Path = REPLAY, hosts: int = 0, idle_s: float = 5.0, monitor_to: Path | None = None) -> dict:
    work = tmp / pool
    bodies = work / "bodies"
    calls_per_session = write_bodies(bodies, replay)
    latency = work / "latency.txt"
    latency.write_text("")
    # The same two bodies in every session: the stand-in keeps their rendered prompts (the
    # tokenizer is its main CPU), so more of the 2 cores go to what is measured.
    model_args = ["--prompt-cache", "16"]
    load0 = os.getloadavg()
    t_setup = time.time()
    if hosts:
        dep = _many_hosts(pool, hosts, run_slots, work, model_args)
    else:
        dep = _single_host(pool, run_slots or slots.concurrency_for("run", pool, slots.host()), work, model_args)
    setup_s = time.time() - t_setup
    try:
        return _measure(pool, n, dep, bodies, calls_per_session, latency, hold, timeout, load0, setup_s, idle_s,
                        monitor_to)
    finally:
        dep.stop()


def _measure(pool: str, n: int, dep: Deployment, bodies: Path, calls_per_session: int, latency: Path,
             hold: float, timeout: float, load0: tuple[float, ...], setup_s: float, idle_s: float,
             monitor_to: Path | None = None) -> dict:
    r = connect(dep.redis_url)
    store = PipelineStore(r)
    time.sleep(2.0)  # the pools' first beats: run@node must be live before init prepares
    idle0, cmd_idle0 = redis_cpu(r), commandstats(r)
    time.sleep(idle_s)  # Redis CPU of an idle deployment (beats, janitors, idle consumers): its floor
    cpu0, mem0, cmd0 = redis_cpu(r), int(r.info("memory")["used_memory"]), commandstats(r)
    idle_rate = (cpu0 - idle0) / idle_s
    role_cpu0 = {k: cpu_s(f()) for k, f in dep.roles.items()}
    monitor = None
    if monitor_to is not None:  # every command Redis runs, to a file (costs Redis CPU: a run of its own)
        url = dep.redis_url.removeprefix("redis://").split("/")[0]
        host, _, port = url.rpartition(":")
        monitor = subprocess.Popen(["redis-cli", "-h", host, "-p", port, "MONITOR"],
                                   stdout=open(monitor_to, "wb"), stderr=subprocess.DEVNULL)
        time.sleep(0.5)
    peak_pss, peak_procs, peak_clients, stop = [0.0], [0], [0], threading.Event()
    # What could limit the run on this machine: open files of one run pool process, tasks
    # (threads + processes) on the machine, memory left.
    peak_fds, peak_tasks, min_avail = [0], [0], [float("inf")]

    def sample() -> None:
        while not stop.wait(0.5):
            pids = dep.run_pids()
            peak_procs[0] = max(peak_procs[0], len(pids))
            peak_pss[0] = max(peak_pss[0], pss_mib(pids))
            for pid in pids:
                try:
                    peak_fds[0] = max(peak_fds[0], len(os.listdir(f"/proc/{pid}/fd")))
                except OSError:
                    pass
            peak_tasks[0] = max(peak_tasks[0], int(Path("/proc/loadavg").read_text().split()[3].split("/")[1]))
            min_avail[0] = min(min_avail[0], mem_available_gib())
    sampler = threading.Thread(target=sample, daemon=True)
    t0 = time.time()
    sids = dep.submit({
        "instruction": "soak", "num_samples": n, "timeout_seconds": max(600, int(timeout)),
        "agent": {"harness": "shell", "model": "policy",
                  "options": {"command": ["bash", "-c", AGENT],
                              "env": {"BODIES": str(bodies), "LATENCY": str(latency),
                                      "UPSTREAM": dep.upstream, "HOLD": str(hold)}}},
        "runtime": {"backend": "local"}, "builder": {"strategy": "per_request"}})
    submit_s = time.time() - t0
    sampler.start()
    # Poll only the active set's size (one SCARD): reading N records every poll is Redis work the
    # run would not have.
    active_key = store.keys.active_sessions()
    deadline = t0 + timeout
    while time.time() < deadline:
        clients = int(r.info("clients")["connected_clients"])
        peak_clients[0] = max(peak_clients[0], clients)
        if r.scard(active_key) == 0:
            break
        time.sleep(1.0)
    elapsed = time.time() - t0
    if monitor is not None:
        monitor.terminate()
        monitor.wait()
    stop.set()
    sampler.join()
    cpu1, mem1, cmd1 = redis_cpu(r), int(r.info("memory")["used_memory"]), commandstats(r)
    role_cpu = {k: cpu_s(f()) - role_cpu0[k] for k, f in dep.roles.items()}
    load1 = os.getloadavg()
    recs = store.get_sessions(sids)
    completed = sum(rec.state == states.COMPLETED for rec in recs)
    lost = n - sum(states.is_terminal(rec.state) for rec in recs)
    dup_terminal = sum(sum(h[0] in states.TERMINAL for h in rec.history) > 1 for rec in recs)
    dup_calls = calls_total = 0
    for rec in recs:
        traj = store.get_trajectory(rec.session_id)
        c = int((traj.stats or {}).get("calls", 0)) if traj is not None else 0
        calls_total += c
        dup_calls += c > calls_per_session
    starts = sorted(rec.timings["running_start"] for rec in recs if rec.timings.get("running_start"))
    spans = [(rec.timings["running_start"], rec.timings.get("running_end", elapsed + t0))
             for rec in recs if rec.timings.get("running_start")]
    lines = [ln.split() for ln in latency.read_text().splitlines() if ln.strip()]
    pairs = [(float(g), float(d)) for _, _, g, d in lines]
    vs_direct = [(g - d) * 1000 for g, d in pairs]
    direct = [d * 1000 for _, d in pairs]
    # What the gateway adds to a call: the client's time for it minus the upstream's part as the
    # gateway timed it (the capture record's latency_ms), the same call on both sides. (Through the
    # gateway − a direct call of the same body differs by the stand-in's queueing of a fresh
    # connection against the gateway's pooled ones once it is saturated.)
    gws = GatewayStore(r)
    recorded: dict[tuple[str, int], float] = {}
    for rec in recs:
        if rec.gateway_session_id:
            calls = sorted(gws.calls(rec.gateway_session_id), key=lambda c: c.started_at)
            for i, c in enumerate(calls):
                recorded[(rec.session_id, i)] = c.latency_ms
    added = [float(g) * 1000 - recorded[(sid, int(i))] for sid, i, g, _ in lines if (sid, int(i)) in recorded]
    redis_s = cpu1 - cpu0
    per_cmd = {k: (c - cmd0.get(k, (0, 0))[0], u - cmd0.get(k, (0, 0))[1]) for k, (c, u) in cmd1.items()}
    per_cmd = {k: v for k, v in per_cmd.items() if v[0] > 0 and k not in ("info", "scard")}
    # the idle deployment's commands (beats, idle consumers' BRPOPs, janitors) over the run's time
    # are not the sessions': its per-second rate, measured before the submit, is taken off
    idle_cmds = {k: (c - cmd_idle0.get(k, (0, 0))[0]) * elapsed / idle_s for k, (c, _) in cmd0.items()}
    per_cmd_above = {k: c - idle_cmds.get(k, 0.0) for k, (c, _) in per_cmd.items()}
    cmd_usec = sum(u for _, u in per_cmd.values())
    top = sorted(per_cmd.items(), key=lambda kv: -kv[1][1])[:6]
    above_idle = redis_s - idle_rate * elapsed
    run_slots = dep.slots["run"]
    return {
        "pool": pool, "hosts": dep.hosts, "sessions": n,
        "slots_init_run_postrun": f"{dep.slots['init']}/{run_slots}/{dep.slots['postrun']}",
        "host": slots.host().describe(), "load_before_after": f"{load0[0]:.1f} -> {load1[0]:.1f}",
        "setup_s": round(setup_s, 1), "submit_s": round(submit_s, 2),
        "completed": completed, "lost": lost, "duplicated": dup_terminal + dup_calls,
        "time_to_finish_s": round(elapsed, 1), "sessions_per_s": round(n / elapsed, 2),
        "dispatch_rate_per_s": round((len(starts) - 1) / (starts[-1] - starts[0]), 1) if len(starts) > 1 else None,
        "peak_running": peak_overlap(spans),
        "sessions_per_host": ", ".join(f"{k} {v}" for k, v in sorted(Counter(str(rec.runtime_host)
                                                                             for rec in recs).items())),
        "calls_captured": calls_total, "calls_per_session": calls_per_session,
        "gateway_added_ms_p50": round(pct(added, .5), 1), "gateway_added_ms_p99": round(pct(added, .99), 1),
        "gateway_added_paired_calls": len(added),
        "gateway_minus_direct_ms_p50": round(pct(vs_direct, .5), 1),
        "gateway_minus_direct_ms_p99": round(pct(vs_direct, .99), 1),
        "gateway_ms_p50": round(pct([g * 1000 for g, _ in pairs], .5), 1),
        "gateway_ms_p99": round(pct([g * 1000 for g, _ in pairs], .99), 1),
        "upstream_direct_ms_p50": round(pct(direct, .5), 1),
        "upstream_direct_ms_p99": round(pct(direct, .99), 1),
        "redis_cpu_s": round(redis_s, 2), "redis_idle_cpu_ms_per_s": round(idle_rate * 1000, 2),
        "redis_cpu_ms_per_session": round(redis_s * 1000 / n, 2),
        "redis_cpu_ms_per_session_above_idle": round(above_idle * 1000 / n, 2),
        "redis_cpu_ms_per_call": round(redis_s * 1000 / max(1, calls_total), 3),
        "redis_busy_pct_during_run": round(100 * redis_s / elapsed, 1),
        "redis_saturates_at_sessions_per_s": round(n / above_idle) if above_idle > 0 else None,
        "redis_cmds_per_session": round(sum(c for c, _ in per_cmd.values()) / n, 1),
        "redis_cmd_usec_per_session": round(cmd_usec / n),
        "redis_top_cmds_usec_per_session": ", ".join(f"{k} {u / n:.0f}" for k, (_, u) in top),
        "redis_cmds_per_session_above_idle": round(sum(per_cmd_above.values()) / n, 1),
        "redis_idle_cmds_per_s": round(sum(idle_cmds.values()) / elapsed, 1),
        "redis_top_cmds_calls_per_session_above_idle": ", ".join(f"{k} {c / n:.1f}" for k, c in sorted(
            per_cmd_above.items(), key=lambda kv: -kv[1])[:8]),
        "redis_peak_clients": peak_clients[0],
        "redis_mem_delta_mib": round((mem1 - mem0) / 2**20, 1),
        "redis_bytes_per_session": int((mem1 - mem0) / n),
        "run_pool_processes": peak_procs[0], "run_pool_pss_mib": round(peak_pss[0], 1),
        "run_pool_pss_kib_per_slot": int(peak_pss[0] * 1024 / run_slots),
        "run_pool_peak_fds_per_process": peak_fds[0],
        "machine_peak_tasks": peak_tasks[0], "machine_min_mem_available_gib": round(min_avail[0], 1),
        "cpu_ms_per_session": ", ".join(f"{k} {v * 1000 / n:.1f}" for k, v in role_cpu.items()),
        "notes": "; ".join(dep.notes),
        "first_errors": sorted({str(rec.error)[:200] for rec in recs if rec.state != states.COMPLETED})[:3],
    }


def table(results: list[dict]) -> str:
    keys = list(results[0])
    width = max(len(k) for k in keys)
    cols = [max(14, *(len(str(r[k])) for k in keys if k not in ("first_errors",))) for r in results]
    lines = [f"| {'':{width}} | " + " | ".join(f"{r['pool']:>{c}}" for r, c in zip(results, cols)) + " |",
             f"|{'-' * (width + 2)}|" + "|".join("-" * (c + 2) for c in cols) + "|"]
    for k in keys[1:]:
        lines.append(f"| {k:{width}} | " + " | ".join(f"{str(r[k]):>{c}}" for r, c in zip(results, cols)) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=1024)
    ap.add_argument("--hosts", type=int, default=0,
                    help="worker hosts as network namespaces around a hub (root); 0: one host, `polar-mq up`'s stack")
    ap.add_argument("--pools", default="threads,prefork", help="comma-separated Celery pools, one deployment each")
    ap.add_argument("--run-slots", type=int, default=0,
                    help="run slots per host of every pool (default: each pool's own host-sized default, slots.py)")
    ap.add_argument("--prefork-run-slots", type=int, default=0,
                    help="run slots per host of the prefork pool only (a process each: what fits in memory)")
    ap.add_argument("--hold", type=float, default=2.0, help="seconds each agent holds its slot after its calls")
    ap.add_argument("--timeout", type=float, default=3600.0)
    ap.add_argument("--replay", type=Path, default=REPLAY, help="a recorded openai_chat replay (tests/replays)")
    ap.add_argument("--idle", type=float, default=5.0, help="seconds the idle deployment's Redis CPU is measured")
    ap.add_argument("--monitor", type=Path,
                    help="capture Redis MONITOR during the run into FILE (POOL appended); for the command mix "
                         "and bench/bench_redis_ceiling.py, not for figures: MONITOR slows Redis")
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="polar-bench-soak-"))
    results = []
    for pool in [p.strip() for p in args.pools.split(",") if p.strip()]:
        run_slots = (args.prefork_run_slots if pool == "prefork" and args.prefork_run_slots else args.run_slots) or None
        res = soak(pool, args.sessions, run_slots, args.hold, tmp, args.timeout, args.replay, args.hosts,
                   max(0.5, args.idle),
                   args.monitor.with_name(f"{args.monitor.name}.{pool}") if args.monitor else None)
        print(json.dumps(res), flush=True)
        results.append(res)
    print()
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0 if all(r["lost"] == 0 and r["duplicated"] == 0 and r["completed"] == r["sessions"]
                    for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
