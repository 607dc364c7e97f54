"""Where one Redis ends: the pipeline's per-session Redis traffic replayed against a bare Redis.

Input: a MONITOR capture of a soak (`bench/bench_soak.py --monitor FILE ...`): every command the
deployment sent while N sessions of one task ran, the Lua scripts' sources included (redis-py
loads a script on its first NOSCRIPT). The driver replays the clients' commands (not the ones a
script ran: Lua re-runs those) in their order, once per copy, each copy with the task id (and so
every session, gateway session and key derived from it) rewritten to a fresh one, MULTI/EXEC
blocks sent as the client sent them (one round trip), one command per round trip otherwise,
blocking pops made non-blocking (LMPOP: the same pop, no wait). --procs client processes with
one connection each run copies side by side against a fresh redis-server (no AOF, as
`polar-mq up`), until --seconds pass.

Reported: copies and sessions replayed per second, Redis CPU (INFO cpu delta) per session and
its busy share of one core, and so the rate at which Redis would be saturated:
sessions/s at 100% = sessions replayed / Redis CPU seconds. On a box with few cores the client
processes compete with Redis: the measured rate is then the clients', the CPU per session is
still Redis's own.

    python bench/bench_soak.py --hosts 2 --sessions 64 --pools threads --monitor /tmp/mon
    python bench/bench_redis_ceiling.py /tmp/mon.threads [--procs 4] [--seconds 30]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from polar_mq.cli.embedded_redis import free_port  # noqa: E402

LINE = re.compile(rb"^\d+\.\d+ \[\d+ ([^\]]+)\] (.*)$")
TASK = re.compile(rb"pmq:task:([0-9a-f]{32})")
ESC = {ord("n"): 10, ord("r"): 13, ord("t"): 9, ord("a"): 7, ord("b"): 8, ord('"'): 34, ord("\\"): 92}
BLOCKING = {b"BRPOP", b"BLPOP"}
SKIP = {b"INFO", b"SCARD", b"MONITOR", b"CLIENT", b"HELLO", b"PING", b"CONFIG", b"SCRIPT", b"SELECT"}


def parse_args(rest: bytes) -> list[bytes]:
    """MONITOR's quoted, C-escaped arguments (sdscatrepr) back to bytes."""
    out, i, n = [], 0, len(rest)
    while i < n:
        if rest[i] != 34:  # '"'
            i += 1
            continue
        i += 1
        buf = bytearray()
        while i < n and rest[i] != 34:
            c = rest[i]
            if c == 92 and i + 1 < n:
                nxt = rest[i + 1]
                if nxt == ord("x") and i + 3 < n:
                    buf.append(int(rest[i + 2:i + 4], 16))
                    i += 4
                    continue
                buf.append(ESC.get(nxt, nxt))
                i += 2
                continue
            buf.append(c)
            i += 1
        out.append(bytes(buf))
        i += 1
    return out


def load(path: Path) -> tuple[bytes, list[bytes], list[list[list[bytes]]], int]:
    """(task id, script sources, units, sessions): a unit is one command or one MULTI block."""
    task = None
    scripts: list[bytes] = []
    units: list[list[list[bytes]]] = []
    open_blocks: dict[bytes, list[list[bytes]]] = {}
    sessions: set[bytes] = set()
    for raw in path.read_bytes().splitlines():
        m = LINE.match(raw)
        if not m:
            continue
        who, rest = m.group(1), m.group(2)
        if who == b"lua":
            continue  # run by a script: the replayed script runs it again
        args = parse_args(rest)
        if not args:
            continue
        name = args[0].upper()
        if name == b"SCRIPT" and len(args) > 2 and args[1].upper() == b"LOAD":
            scripts.append(args[2])
            continue
        if task is None:
            t = TASK.search(rest)
            task = t.group(1) if t else None
        for s in re.findall(rb"pmq:session:([0-9a-f]{32}-\d+)-", rest):
            sessions.add(s)
        if name in SKIP:
            continue
        if name in BLOCKING:  # BRPOP k1 .. kn timeout -> LMPOP n k1 .. kn RIGHT|LEFT
            keys = args[1:-1]
            args = [b"LMPOP", str(len(keys)).encode(), *keys, b"RIGHT" if name == b"BRPOP" else b"LEFT"]
        if name == b"MULTI":
            open_blocks[who] = []
        elif who in open_blocks:
            if name == b"EXEC":
                units.append(open_blocks.pop(who))
            elif name == b"DISCARD":
                open_blocks.pop(who)
            else:
                open_blocks[who].append(args)
        else:
            units.append([args])
    if task is None:
        raise SystemExit(f"{path}: no pmq:task:<id> key in the capture")
    return task, scripts, units, len(sessions)


def rewrite(units: list[list[list[bytes]]], task: bytes, copy: int) -> list[list[list[bytes]]]:
    new = (b"%08x" % copy) + task[8:]
    return [[[a.replace(task, new) for a in cmd] for cmd in unit] for unit in units]


def worker(url: str, units: list[list[list[bytes]]], task: bytes, first: int, step: int, until: float,
           done: "mp.Queue[tuple[int, int]]") -> None:
    r = redis.Redis.from_url(url)
    copies = errors = 0
    copy = first
    while time.time() < until:
        for unit in rewrite(units, task, copy):
            try:
                if len(unit) == 1:
                    r.execute_command(*unit[0])
                else:
                    pipe = r.pipeline(transaction=True)
                    for cmd in unit:
                        pipe.execute_command(*cmd)
                    pipe.execute(raise_on_error=False)
            except redis.ResponseError:
                errors += 1
        copies += 1
        copy += step
    done.put((copies, errors))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("capture", type=Path, help="a MONITOR capture from bench_soak.py --monitor")
    ap.add_argument("--procs", type=int, default=4, help="client processes, one connection each")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--json", type=Path, help="write the results here too")
    args = ap.parse_args()
    task, scripts, units, sessions = load(args.capture)
    commands = sum(len(u) for u in units)
    print(f"capture: task {task.decode()}, {sessions} sessions, {len(units)} round trips, {commands} commands, "
          f"{len(scripts)} scripts", flush=True)
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("needs redis-server")
    tmp = tempfile.mkdtemp(prefix="polar-redis-ceiling-")
    port = free_port()  # TCP on loopback, as the deployment's clients connect (not a unix socket)
    server = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no", "--dir", tmp], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        url = f"redis://127.0.0.1:{port}/0"
        r = redis.Redis.from_url(url)
        deadline = time.time() + 10
        while True:
            try:
                r.ping()
                break
            except redis.ConnectionError:
                if time.time() > deadline:
                    raise
                time.sleep(0.05)
        for src in scripts:
            r.script_load(src)
        cpu = r.info("cpu")
        cpu0 = float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])
        t0 = time.time()
        until = t0 + args.seconds
        done: mp.Queue = mp.Queue()
        procs = [mp.Process(target=worker, args=(url, units, task, i + 1, args.procs, until, done))
                 for i in range(args.procs)]
        for p in procs:
            p.start()
        results = [done.get() for _ in procs]
        for p in procs:
            p.join()
        elapsed = time.time() - t0
        cpu = r.info("cpu")
        redis_s = float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]) - cpu0
        copies = sum(c for c, _ in results)
        errors = sum(e for _, e in results)
        replayed = copies * sessions
        mem = int(r.info("memory")["used_memory"])
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    res = {
        "procs": args.procs, "seconds": round(elapsed, 1), "copies": copies, "sessions_replayed": replayed,
        "sessions_per_s": round(replayed / elapsed, 1), "commands_per_s": round(copies * commands / elapsed),
        "round_trips_per_session": round(len(units) / sessions, 1),
        "commands_per_session": round(commands / sessions, 1), "error_replies": errors,
        "redis_cpu_s": round(redis_s, 2), "redis_busy_pct": round(100 * redis_s / elapsed, 1),
        "redis_cpu_ms_per_session": round(redis_s * 1000 / max(1, replayed), 3),
        "redis_saturates_at_sessions_per_s": round(replayed / redis_s) if redis_s > 0 else None,
        "redis_used_memory_mib": round(mem / 2**20, 1),
    }
    width = max(len(k) for k in res)
    for k, v in res.items():
        print(f"{k:{width}}  {v}")
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
