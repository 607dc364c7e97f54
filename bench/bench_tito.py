"""Token-in continuation: what it costs per call, and how many breaks it removes.

Starts an embedded Redis, the stand-in model server serving the Qwen3-style template (its
generation prompt opens with an empty think block that history never renders:
polar_mq/dev/model_server/templates.py) and two gateways (gunicorn, 1 worker each): `--tito on` with
that tokenizer, and `--tito off`. Then, side by side in one run:

1. latency of a continued call (the call that answers a tool result) on the real CLI captures in
   tests/replays (pi / opencode / qwen-code / claude-code / codex / gemini-cli requests, 2-20 KB
   system prompts and tool lists): each fixture replayed into fresh sessions, the last call timed,
   p50 / p90 per gateway, and the ratio; plus the same at call `--turns` of a growing session
   (matching reads what was recorded since its last look: tito/index.py);
2. breaks per 100 calls per harness on the same replays, before (tito off) and after (tito on), from
   prefix_merging's `stats.breaks`.

    python bench/bench_tito.py [-n 10] [--turns 20]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from polar_mq.cli.embedded_redis import free_port, start_embedded  # noqa: E402
from polar_mq.dev.model_server.templates import QWEN3_STYLE
from polar_mq.dev.model_server.templates import write_tokenizer_dir  # noqa: E402
from polar_mq.dev.model_server.tokenizer import load_tokenizer  # noqa: E402
from polar_mq.auth import auth_headers  # noqa: E402
from polar_mq.cli.up import wait_http  # noqa: E402

REPLAYS = ROOT / "tests" / "replays"
KEY = "REPLAY_KEY"


def spawn(args: list[str], health: str, log: Path) -> subprocess.Popen:
    proc = subprocess.Popen(args, stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_http(health, proc, timeout=180)
    except RuntimeError as exc:
        proc.kill()
        raise SystemExit(f"{exc}; see {log}") from None
    return proc


def replay(gateway: str, fixture: dict, http: requests.Session) -> tuple[str, float]:
    """Replay one capture into a fresh session; (session id, ms of the last generation call)."""
    sess = http.post(f"{gateway}/sessions", json={}, timeout=10).json()
    last_ms = 0.0
    for req in fixture["requests"]:
        data = None
        if req["body"] is not None:
            data = (json.dumps(req["body"]) if req["body_format"] == "json" else req["body"])
            data = data.replace(KEY, sess["key"]).encode()
        t0 = time.perf_counter()
        resp = http.request(req["method"], gateway + req["path"].replace(KEY, sess["key"]), data=data,
                            headers={k: v.replace(KEY, sess["key"]) for k, v in req["headers"].items()},
                            timeout=120)
        _ = resp.content
        if req["generation"]:
            if resp.status_code != 200:
                raise SystemExit(f"replay failed: {resp.status_code} {resp.text[:300]}")
            last_ms = (time.perf_counter() - t0) * 1000
    return sess["session_id"], last_ms


def growing_session(gateway: str, turns: int, http: requests.Session) -> float:
    """A chat session of `turns` calls (tool call, result, ...); ms of the last call."""
    sess = http.post(f"{gateway}/sessions", json={}, timeout=10).json()
    url = f"{gateway}/s/{sess['key']}/v1/chat/completions"
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
    msgs = [{"role": "system", "content": "You are a coding agent. " * 200}, {"role": "user", "content": "go"}]
    ms = 0.0
    for i in range(turns):
        t0 = time.perf_counter()
        msg = http.post(url, json={"model": "m", "messages": msgs, "tools": tools}, timeout=60).json()
        ms = (time.perf_counter() - t0) * 1000
        reply = msg["choices"][0]["message"]
        msgs.append({k: v for k, v in reply.items() if v is not None})
        if reply.get("tool_calls"):
            msgs.append({"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": f"out {i}"})
        else:
            msgs.append({"role": "user", "content": f"next step {i}"})
    return ms


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=10, help="replays of each capture per gateway")
    ap.add_argument("--turns", type=int, default=20, help="calls in the growing session")
    ap.add_argument("--growing", type=int, default=5, help="growing sessions per gateway")
    args = ap.parse_args()

    from rich.console import Console
    from rich.table import Table

    console = Console(width=150)
    logs = Path(tempfile.mkdtemp(prefix="polar-bench-tito-"))
    tok_dir = write_tokenizer_dir(load_tokenizer().path, logs / "tokenizer", QWEN3_STYLE)
    procs: list[subprocess.Popen] = []
    redis_server = start_embedded()
    try:
        mport = free_port()
        upstream = f"http://127.0.0.1:{mport}"
        gateways: dict[str, str] = {}
        with console.status("starting the stand-in (Qwen3-style template) and two gateways…"):
            procs.append(spawn([sys.executable, "-m", "polar_mq.dev.model_server", "--port", str(mport),
                                "--max-model-len", "65536", "--chat-template", "qwen3"],
                               f"{upstream}/health", logs / "ms.log"))
            for mode in ("off", "on"):
                port = free_port()
                extra = ["--tokenizer", str(tok_dir)] if mode == "on" else []
                procs.append(spawn([sys.executable, "-m", "polar_mq.cli", "gateway", "--port", str(port),
                                    "--redis", redis_server.url, "--upstream", upstream, "--workers", "1",
                                    "--tito", mode, *extra],
                                   f"http://127.0.0.1:{port}/health", logs / f"gw-{mode}.log"))
                gateways[mode] = f"http://127.0.0.1:{port}"
        http = requests.Session()
        http.headers.update(auth_headers())  # the gateways' admin token ($POLAR_HOME/token)
        fixtures = sorted(REPLAYS.glob("*/*.json"))
        times: dict[str, list[float]] = defaultdict(list)
        breaks: dict[tuple[str, str], int] = defaultdict(int)
        calls: dict[tuple[str, str], int] = defaultdict(int)
        continued: dict[str, int] = defaultdict(int)
        with console.status(f"replaying {len(fixtures)} captures x {args.n} per gateway…"):
            for rep in range(args.n):
                for path in fixtures:
                    fixture = json.loads(path.read_text())
                    harness = path.parent.name
                    for mode in ("off", "on"):  # interleaved: load from others hits both alike
                        sid, ms = replay(gateways[mode], fixture, http)
                        times[mode].append(ms)
                        if rep == 0:
                            traj = http.get(f"{gateways[mode]}/sessions/{sid}/trajectory",
                                            params={"builder": "prefix_merging"}, timeout=30).json()
                            breaks[(harness, mode)] += traj["stats"]["breaks"]
                            calls[(harness, mode)] += traj["stats"]["calls"]
                            if mode == "on":
                                continued[harness] += traj["stats"]["tito"]["continued"]
        with console.status(f"{args.growing} growing sessions of {args.turns} calls per gateway…"):
            for _ in range(args.growing):
                for mode in ("off", "on"):
                    times[f"grow-{mode}"].append(growing_session(gateways[mode], args.turns, http))

        table = Table(title="latency of a continued call (ms), tito off vs on, same run")
        for col in ("input", "off p50", "on p50", "ratio p50", "off p90", "on p90", "n"):
            table.add_column(col, justify="left" if col == "input" else "right")
        for label, off, on in (("replayed CLI captures, last call", times["off"], times["on"]),
                               (f"call {args.turns} of a growing chat session", times["grow-off"],
                                times["grow-on"])):
            table.add_row(label, f"{pct(off, .5):.1f}", f"{pct(on, .5):.1f}",
                          f"{pct(on, .5) / pct(off, .5):.2f}x", f"{pct(off, .9):.1f}", f"{pct(on, .9):.1f}",
                          str(len(on)))
        console.print(table)
        bt = Table(title="breaks per 100 calls on the replays (prefix_merging), before (tito off) / after (tito on)")
        for col in ("harness", "calls", "breaks off", "per 100 off", "breaks on", "per 100 on", "continued on"):
            bt.add_column(col, justify="left" if col == "harness" else "right")
        for harness in sorted({h for h, _ in calls}):
            n_off, n_on = calls[(harness, "off")], calls[(harness, "on")]
            bt.add_row(harness, str(n_on), str(breaks[(harness, "off")]),
                       f"{100 * breaks[(harness, 'off')] / n_off:.1f}", str(breaks[(harness, "on")]),
                       f"{100 * breaks[(harness, 'on')] / n_on:.1f}", str(continued[harness]))
        console.print(bt)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        redis_server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
