"""Many concurrent streamed calls through one gateway worker process, side by side with the same
streams sent to the upstream directly, in one run.

Starts an embedded Redis, the stand-in model server streaming slowly (`--token-latency-ms` per
token, and `polar:sleep=S` before the first token, so every stream is open at the same time)
and the gateway (gunicorn as shipped, ONE worker process; `--worker-class` picks gevent or
gthread). An asyncio client opens N streams (openai chat, `stream: true`) at once, first to the
upstream, then through the gateway of `--baseline REF` (default main: a `git archive` of it first on
that gateway's PYTHONPATH), then through this tree's, and reports per series:
  * how many streams were open at the same time (peak) and how many failed,
  * time to first token (the first frame carrying content) p50/p99, and the gateway's overhead
    over the direct series at each percentile,
  * the gateway worker's CPU per streamed token and its RSS before/at the peak (memory per open
    stream = the difference / N).

    python bench/bench_gateway_streams.py [-n 1024] [--baseline main] [--ramp 20] [--sleep 25] [--tokens 16] [--token-latency-ms 150]
                                          [--gateway-nofile 1024]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_gateway import Cpu, builds, pct, spawn, stop_all  # noqa: E402

from polar_mq.cli.embedded_redis import free_port, start_embedded  # noqa: E402
from polar_mq.auth import auth_headers  # noqa: E402

SEP = b"\r\n\r\n"
CONTENT = re.compile(rb'"(?:content|text)":\s*"[^"]')


async def one_stream(port: int, path: str, body: bytes, started: float, out: list[dict[str, Any]],
                     headers: dict[str, str]) -> None:
    """One streamed call over a raw connection; records open/first-token/end times (s)."""
    rec: dict[str, Any] = {"ok": False}
    t0 = time.perf_counter()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        writer.write(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n{extra}\r\n".encode() + body)
        await writer.drain()
        rec["open"] = time.perf_counter() - started  # held open from here until its end
        buf = b""
        status = None
        while True:
            piece = await reader.read(65536)
            if not piece:
                break
            buf += piece
            if status is None and b"\r\n" in buf:
                status = int(buf.split(b" ", 2)[1])
            if "ttft" not in rec and CONTENT.search(buf.split(b"\r\n\r\n", 1)[-1]):
                rec["ttft"] = time.perf_counter() - t0
            if "ttft" in rec:
                buf = buf[-256:]
        rec["end"] = time.perf_counter() - started
        rec["ok"] = status == 200 and "ttft" in rec
        rec["status"] = status
        if status != 200:
            rec["error"] = f"status {status}: {buf.split(SEP, 1)[-1][:300]!r}"
        writer.close()
    except Exception as exc:  # a refused or reset connection is a failed stream
        rec["error"] = f"{type(exc).__name__}: {exc}"
    out.append(rec)


async def storm(port: int, path: str, body: dict[str, Any], n: int, ramp: float,
                headers: dict[str, str]) -> list[dict[str, Any]]:
    payload = json.dumps(body).encode()
    out: list[dict[str, Any]] = []
    started = time.perf_counter()
    tasks = []
    for i in range(n):
        tasks.append(asyncio.create_task(one_stream(port, path, payload, started, out, headers)))
        if ramp:
            await asyncio.sleep(ramp / n)
    await asyncio.gather(*tasks)
    return out


def peak_open(recs: list[dict[str, Any]]) -> int:
    events = sorted([(r["open"], 1) for r in recs if "open" in r and "end" in r] +
                    [(r["end"], -1) for r in recs if "open" in r and "end" in r])
    best = cur = 0
    for _, d in events:
        cur += d
        best = max(best, cur)
    return best


def summary(recs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in recs if r["ok"]]
    ttft = [r["ttft"] * 1000 for r in ok]
    errors = [r.get("error") or f"status {r.get('status')}" for r in recs if not r["ok"]]
    return {"streams": len(recs), "ok": len(ok), "failed": len(recs) - len(ok), "peak_open": peak_open(recs),
            "ttft_p50_ms": round(pct(ttft, .5), 1) if ttft else None,
            "ttft_p99_ms": round(pct(ttft, .99), 1) if ttft else None,
            "first_errors": errors[:3]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=1024, help="concurrent streams")
    ap.add_argument("--sleep", type=float, default=25.0, help="upstream delay before the first token (s)")
    ap.add_argument("--ramp", type=float, default=20.0,
                    help="seconds over which the streams are opened (the stand-in renders and "
                         "tokenizes each prompt: ~50 per second here); --sleep > --ramp keeps them all open at once")
    ap.add_argument("--tokens", type=int, default=16, help="max_tokens per stream")
    ap.add_argument("--token-latency-ms", type=float, default=150.0)
    ap.add_argument("--worker-class", choices=["gevent", "gthread"],
                    help="gateway worker model (default: the gateway's default, gevent)")
    ap.add_argument("--gateway-nofile", type=int, default=0,
                    help="start the gateways under this soft open-files limit (1024: a login shell's or "
                         "systemd's default); the client and the stand-in keep this process's")
    ap.add_argument("--json", action="store_true", help="print only the JSON summary")
    ap.add_argument("--baseline", default="main",
                    help="git ref whose gateway is measured too, after the direct series ('' to skip)")
    ap.add_argument("--after-first", action="store_true",
                    help="measure this tree's gateway before the baseline's (the storms run one after the other)")
    args = ap.parse_args()

    logs = Path(tempfile.mkdtemp(prefix="polar-bench-streams-"))
    procs = []
    redis_server = start_embedded()
    code = builds(args.baseline, logs)
    os.chdir(logs)  # `python -m` puts the cwd first on sys.path: children import what PYTHONPATH says
    results: list[dict[str, Any]] = []
    try:
        mport = free_port()
        upstream = f"http://127.0.0.1:{mport}"
        # The stand-in's werkzeug server listens with a backlog of 128: past that, connections
        # wait for SYN retries (1 s, 3 s, ...). vLLM (uvicorn) listens with 2048; so does this.
        launch = ("import sys, werkzeug.serving as s; s.BaseWSGIServer.request_queue_size = 2048; "
                  "from polar_mq.dev.model_server.__main__ import main; sys.exit(main(sys.argv[1:]))")
        procs.append(spawn([sys.executable, "-c", launch, "--port", str(mport),
                            "--token-latency-ms", str(args.token_latency_ms)], f"{upstream}/health",
                           logs / "ms.log"))
        gateways = []
        for i, (label, env) in enumerate(code):
            gport = free_port()
            limit = ["bash", "-c", f'ulimit -Sn {args.gateway_nofile} && exec "$@"', "gw"] if args.gateway_nofile else []
            procs.append(spawn([*limit, sys.executable, "-m", "polar_mq.cli", "gateway", "--port", str(gport),
                                "--redis", redis_server.url, "--upstream", upstream, "--workers", "1",
                                *(["--worker-class", args.worker_class] if args.worker_class else [])],
                               f"http://127.0.0.1:{gport}/health", logs / f"gw{i}.log", env=env))
            key = requests.post(f"http://127.0.0.1:{gport}/sessions", headers=auth_headers(), json={},
                                timeout=10).json()["key"]
            gateways.append((label, gport, key, Cpu(procs[-1].pid)))
        body = {"model": "stand-in", "max_tokens": args.tokens, "stream": True,
                "messages": [{"role": "user", "content": f"Talk polar:long polar:notool polar:sleep={args.sleep}"}]}
        direct_body = {**body, "logprobs": True, "return_token_ids": True,
                       "stream_options": {"include_usage": True}}
        # warm-up: a few streams each way (connections, imports, first records)
        asyncio.run(storm(mport, "/v1/chat/completions", {**direct_body, "messages": [
            {"role": "user", "content": "hi polar:notool"}]}, 4, 0, {}))
        for _, gport, key, _ in gateways:
            asyncio.run(storm(gport, f"/s/{key}/v1/chat/completions", {**body, "messages": [
                {"role": "user", "content": "hi polar:notool"}]}, 4, 0, {}))

        direct = asyncio.run(storm(mport, "/v1/chat/completions", direct_body, args.n, args.ramp, {}))
        if args.after_first:
            gateways.reverse()
        d = summary(direct)
        for label, gport, key, cpu in gateways:
            rss_idle = cpu.rss_mib()
            peak_rss = [rss_idle]
            stop = threading.Event()

            def sample() -> None:
                while not stop.wait(0.2):
                    peak_rss.append(cpu.rss_mib())

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            c0 = cpu.seconds()
            through = asyncio.run(storm(gport, f"/s/{key}/v1/chat/completions", body, args.n, args.ramp, {}))
            gw_cpu = cpu.seconds() - c0
            stop.set()
            sampler.join()
            g = summary(through)
            tokens = g["ok"] * args.tokens
            results.append({
                "label": label, "worker_class": args.worker_class or "default", "streams": args.n,
                "direct": d, "gateway": g,
                "ttft_overhead_p50_ms": round(g["ttft_p50_ms"] - d["ttft_p50_ms"], 1) if g["ok"] and d["ok"] else None,
                "ttft_overhead_p99_ms": round(g["ttft_p99_ms"] - d["ttft_p99_ms"], 1) if g["ok"] and d["ok"] else None,
                "gateway_cpu_s": round(gw_cpu, 2),
                "gateway_cpu_ms_per_token": round(gw_cpu * 1000 / tokens, 4) if tokens else None,
                "rss_idle_mib": round(rss_idle, 1), "rss_peak_mib": round(max(peak_rss), 1),
                "rss_kib_per_open_stream": round((max(peak_rss) - rss_idle) * 1024 / max(1, g["peak_open"]), 1),
            })
    finally:
        stop_all(procs)
        redis_server.stop()

    if not args.json:
        print(f"{args.n} concurrent streams, 1 gateway worker ({args.worker_class or 'default'}) per build, "
              f"upstream sleeps {args.sleep:g} s then {args.tokens} tokens at {args.token_latency_ms:g} ms")
        print(f"{'series':22s} {'ok':>6s} {'failed':>6s} {'peak open':>9s} {'TTFT p50 ms':>12s} {'TTFT p99 ms':>12s} "
              f"{'ovh p50':>8s} {'ovh p99':>8s} {'CPU ms/tok':>10s} {'RSS MiB':>14s} {'KiB/stream':>10s}")
        print(f"{'direct':22s} {d['ok']:6d} {d['failed']:6d} {d['peak_open']:9d} {d['ttft_p50_ms']!s:>12s} "
              f"{d['ttft_p99_ms']!s:>12s}")
        for r in results:
            g = r["gateway"]
            print(f"{r['label']:22s} {g['ok']:6d} {g['failed']:6d} {g['peak_open']:9d} {g['ttft_p50_ms']!s:>12s} "
                  f"{g['ttft_p99_ms']!s:>12s} {r['ttft_overhead_p50_ms']!s:>8s} {r['ttft_overhead_p99_ms']!s:>8s} "
                  f"{r['gateway_cpu_ms_per_token']!s:>10s} {r['rss_idle_mib']:>6} → {r['rss_peak_mib']:<6} "
                  f"{r['rss_kib_per_open_stream']:>10}")
    print(json.dumps(results))
    return 0 if all(r["gateway"]["failed"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
