"""Gateway CPU per streamed token: the client's writer reading the upstream itself after the first
events (core.Handover, the default) vs a reader thread per stream to the end with a queue to the
writer (POLAR_STREAM_HANDOVER=0, the way before).

Starts an embedded Redis, two stand-ins (one streaming as fast as it can, one at a decode pace of
--token-ms per token, as vLLM streams) and, on each, two gateways (gunicorn as shipped, 1 worker
process) that differ only in POLAR_STREAM_HANDOVER. Then, alternating the two gateways in
rounds so both see the same load:
  * long answers one at a time (openai chat and anthropic, `polar:long`, ~500 tokens) from the
    fast stand-in;
  * --concurrent streams at once (openai chat, --max-tokens each) from the paced stand-in: every
    token is its own wake-up of the gateway, as with real vLLM and many agents.
Prints the gateway worker's CPU per token (user+system, psutil) side by side with the ratio.

    python bench/bench_stream_handover.py [--rounds 6] [--concurrent 64] [--token-ms 20]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_gateway import Cpu, SdkSession, spawn, stop_all  # noqa: E402

from polar_mq.cli.embedded_redis import free_port, start_embedded  # noqa: E402
from polar_mq.auth import auth_headers  # noqa: E402

MODES = {"reader to the end": "0", "handover": "1"}
LONG = "Talk polar:long polar:notool"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=6, help="alternating blocks per series")
    ap.add_argument("--per-round", type=int, default=4, help="long answers per gateway per round")
    ap.add_argument("--concurrent", type=int, default=64, help="streams at once in the paced series")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens per paced stream")
    ap.add_argument("--token-ms", type=int, default=20, help="the paced stand-in's delay per token")
    args = ap.parse_args()

    from rich.console import Console
    from rich.table import Table

    console = Console(width=140)
    logs = Path(tempfile.mkdtemp(prefix="polar-bench-handover-"))
    procs = []
    redis_server = start_embedded()
    try:
        gateways: dict[tuple[str, str], tuple[str, str, Cpu]] = {}  # (upstream, mode) -> url, key, cpu
        with console.status("starting stand-ins and gateways…"):
            ups = {}
            for name, extra in (("fast", []), ("paced", ["--token-latency-ms", str(args.token_ms)])):
                port = free_port()
                ups[name] = f"http://127.0.0.1:{port}"
                procs.append(spawn([sys.executable, "-m", "polar_mq.dev.model_server", "--port", str(port), *extra],
                                   f"{ups[name]}/health", logs / f"ms-{name}.log"))
            for name, url in ups.items():
                for mode, flag in MODES.items():
                    gport = free_port()
                    procs.append(spawn([sys.executable, "-m", "polar_mq.cli", "gateway", "--port", str(gport),
                                        "--redis", redis_server.url, "--upstream", url, "--workers", "1"],
                                       f"http://127.0.0.1:{gport}/health", logs / f"gw-{name}-{flag}.log",
                                       env={"POLAR_STREAM_HANDOVER": flag}))
                    gw = f"http://127.0.0.1:{gport}"
                    key = requests.post(f"{gw}/sessions", headers=auth_headers(), json={}, timeout=5).json()["key"]
                    gateways[(name, mode)] = (gw, key, Cpu(procs[-1].pid))

        http = SdkSession()
        long_tokens = http.post(f"{ups['fast']}/v1/chat/completions", json={
            "model": "stand-in", "max_tokens": 512,
            "messages": [{"role": "user", "content": LONG}]}).json()["usage"]["completion_tokens"]
        bodies = {
            "openai chat": ("/v1/chat/completions", {"model": "stand-in", "max_tokens": 512, "stream": True,
                                                     "messages": [{"role": "user", "content": LONG}]}),
            "anthropic": ("/v1/messages", {"model": "claude-policy", "max_tokens": 512, "stream": True,
                                           "messages": [{"role": "user", "content": LONG}]}),
        }
        rows: list[tuple[str, dict[str, float]]] = []
        for label, (path, body) in bodies.items():
            cpu = {m: 0.0 for m in MODES}
            for mode in MODES:  # warm-up
                gw, key, _ = gateways[("fast", mode)]
                http.post(f"{gw}/s/{key}{path}", json=body).content
            with console.status(f"long answers one at a time ({label})…"):
                for r in range(args.rounds):
                    order = list(MODES) if r % 2 == 0 else list(MODES)[::-1]
                    for mode in order:
                        gw, key, meter = gateways[("fast", mode)]
                        c0 = meter.seconds()
                        for _ in range(args.per_round):
                            resp = http.post(f"{gw}/s/{key}{path}", json=body)
                            assert resp.status_code == 200 and len(resp.content) > 1000, resp.text[:300]
                        cpu[mode] += meter.seconds() - c0
            n = args.rounds * args.per_round * long_tokens
            rows.append((f"{label}: one ~{long_tokens}-token answer at a time",
                         {m: v * 1000 / n for m, v in cpu.items()}))

        paced_body = {"model": "stand-in", "max_tokens": args.max_tokens, "stream": True,
                      "messages": [{"role": "user", "content": LONG}]}
        paced_tokens = http.post(f"{ups['paced']}/v1/chat/completions", json={
            **paced_body, "stream": False}).json()["usage"]["completion_tokens"]
        cpu = {m: 0.0 for m in MODES}
        pool = ThreadPoolExecutor(args.concurrent)
        sessions = [SdkSession() for _ in range(args.concurrent)]

        def one(i: int, url: str) -> None:
            resp = sessions[i].post(url, json=paced_body)
            assert resp.status_code == 200 and b"[DONE]" in resp.content, resp.text[:300]

        with console.status(f"{args.concurrent} streams at once, {args.token_ms} ms per token…"):
            for r in range(max(2, args.rounds // 2)):
                order = list(MODES) if r % 2 == 0 else list(MODES)[::-1]
                for mode in order:
                    gw, key, meter = gateways[("paced", mode)]
                    url = f"{gw}/s/{key}/v1/chat/completions"
                    c0 = meter.seconds()
                    list(pool.map(lambda i: one(i, url), range(args.concurrent)))
                    cpu[mode] += meter.seconds() - c0
        n = max(2, args.rounds // 2) * args.concurrent * paced_tokens
        rows.append((f"openai chat: {args.concurrent} at once, {args.token_ms} ms/token",
                     {m: v * 1000 / n for m, v in cpu.items()}))

        table = Table(title="gateway CPU per streamed token (ms, worker process user+system)")
        table.add_column("series")
        for mode in MODES:
            table.add_column(mode, justify="right")
        table.add_column("handover / reader", justify="right")
        for label, per in rows:
            table.add_row(label, *(f"{per[m]:.4f}" for m in MODES),
                          f"{per['handover'] / per['reader to the end']:.2f}x")
        console.print(table)
        console.print(f"logs: {logs}")
    finally:
        stop_all(procs)
        redis_server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
