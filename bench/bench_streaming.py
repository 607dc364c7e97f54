"""Streamed answers: real pass-through from the upstream vs a stream synthesised from one
non-streaming upstream call (the gateway's fallback, forced with POLAR_STREAM_PASSTHROUGH=0).

Starts an embedded Redis, the stand-in model server with a per-token delay (or uses a real vLLM
given with --upstream) and two gateways on the same upstream: one streaming through, one
synthesising. For each provider API it times sequential streamed requests, from sending the
request to
  * TTFB: the first byte of the body (a keep-alive ping counts: it is what keeps clients alive),
  * TTFC: the first frame carrying content (text, reasoning or tool arguments),
  * total: the end of the stream,
and prints p50/p90 side by side with the synthetic/streamed ratios. It also checks that both
modes recorded the same completion ids for the same (greedy) request.

    python bench/bench_streaming.py [-n 8] [--token-latency-ms 10] [--words 60]
    python bench/bench_streaming.py --upstream http://127.0.0.1:8000 --max-tokens 256
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_gateway import pct, spawn, stop_all  # noqa: E402

from polar_mq.cli.embedded_redis import free_port, start_embedded  # noqa: E402
from polar_mq.auth import auth_headers

PROVIDERS = ["openai_chat", "anthropic", "openai_responses", "gemini"]


def request_for(provider: str, s: dict[str, Any], prompt: str, max_tokens: int) -> tuple[str, dict]:
    if provider == "openai_chat":
        return (f"{s['base_urls']['openai']}/chat/completions",
                {"model": "m", "stream": True, "max_tokens": max_tokens, "temperature": 0,
                 "stream_options": {"include_usage": True},
                 "messages": [{"role": "user", "content": prompt}]})
    if provider == "anthropic":
        return (f"{s['base_urls']['anthropic']}/v1/messages",
                {"model": "m", "stream": True, "max_tokens": max_tokens, "temperature": 0,
                 "messages": [{"role": "user", "content": prompt}]})
    if provider == "openai_responses":
        return (f"{s['base_urls']['openai']}/responses",
                {"model": "m", "stream": True, "max_output_tokens": max_tokens, "temperature": 0,
                 "input": prompt})
    return (f"{s['base_urls']['gemini']}/v1beta/models/m:streamGenerateContent?alt=sse",
            {"contents": [{"role": "user", "parts": [{"text": prompt}]}],
             "generationConfig": {"maxOutputTokens": max_tokens, "temperature": 0}})


def has_content(provider: str, data: dict[str, Any]) -> bool:
    """Does this frame carry a piece of the answer?"""
    if provider == "openai_chat":
        delta = (data.get("choices") or [{}])[0].get("delta") or {}
        return bool(delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"))
    if provider == "anthropic":
        return data.get("type") == "content_block_delta"
    if provider == "openai_responses":
        return str(data.get("type", "")).endswith(".delta")
    parts = ((data.get("candidates") or [{}])[0].get("content") or {}).get("parts") or []
    return any(p.get("text") or p.get("functionCall") for p in parts)


def one(provider: str, gateway: str, prompt: str, max_tokens: int) -> dict[str, float]:
    s = requests.post(f"{gateway}/sessions", headers=auth_headers(), json={}, timeout=10).json()
    url, body = request_for(provider, s, prompt, max_tokens)
    t0 = time.perf_counter()
    resp = requests.post(url, json=body, stream=True, timeout=(5, 600))
    if resp.status_code != 200:
        raise SystemExit(f"{provider}: {resp.status_code} {resp.text[:300]}")
    ttfb = ttfc = None
    frames = 0
    buf = b""
    for piece in resp.iter_content(chunk_size=None):
        if ttfb is None:
            ttfb = time.perf_counter() - t0
        buf += piece
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if not line.startswith(b"data: {"):
                continue
            frames += 1
            if ttfc is None and has_content(provider, json.loads(line[6:])):
                ttfc = time.perf_counter() - t0
    total = time.perf_counter() - t0
    calls = requests.get(f"{gateway}/sessions/{s['session_id']}/calls", headers=auth_headers(), timeout=10).json()["calls"]
    rec = calls[0]
    return {"ttfb": ttfb or total, "ttfc": ttfc or total, "total": total, "frames": frames,
            "ids": rec["completion_token_ids"], "status": rec["status"],
            "synthetic": any("synthetic" in n for n in rec["notes"])}


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its children (the gunicorn worker), when psutil is there."""
    try:
        import psutil
    except ImportError:
        return float("nan")
    proc = psutil.Process(pid)
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def series(provider: str, gateway: str, pid: int, prompt: str, max_tokens: int,
           n: int) -> list[dict[str, Any]]:
    one(provider, gateway, prompt, max_tokens)  # warm-up
    cpu0 = cpu_seconds(pid)
    rows = [one(provider, gateway, prompt, max_tokens) for _ in range(n)]
    cpu = (cpu_seconds(pid) - cpu0) / n
    for r in rows:
        r["cpu"] = cpu
    return rows


def direct(upstream: str, prompt: str, max_tokens: int, n: int, stream: bool) -> tuple[list[float], list[float]]:
    """The upstream alone (chat completions with ids and logprobs), for reference."""
    model = requests.get(f"{upstream}/v1/models", timeout=10).json()["data"][0]["id"]
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "logprobs": True, "return_token_ids": True, "stream": stream}
    firsts, totals = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        resp = requests.post(f"{upstream}/v1/chat/completions", json=body, stream=stream, timeout=600)
        first = None
        for piece in resp.iter_content(chunk_size=None):
            if first is None and (not stream or b'"content":"' in piece.replace(b'"content":""', b"")):
                first = time.perf_counter() - t0
        totals.append(time.perf_counter() - t0)
        firsts.append(first if first is not None else totals[-1])
    return firsts, totals


def ms(values: list[float], q: float) -> float:
    return pct([v * 1000 for v in values], q)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=8, help="streamed requests per provider and mode")
    ap.add_argument("--upstream", help="a real vLLM server root (default: start the stand-in)")
    ap.add_argument("--token-latency-ms", type=float, default=10.0, help="stand-in delay per token")
    ap.add_argument("--words", type=int, default=60, help="stand-in answer length in words")
    ap.add_argument("--prompt", default="Write a short story about a robot learning to paint.",
                    help="prompt for a real upstream")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--providers", default=",".join(PROVIDERS))
    args = ap.parse_args()
    providers = [p for p in args.providers.split(",") if p]

    logs = Path(tempfile.mkdtemp(prefix="polar-bench-stream-"))
    procs = []
    redis = start_embedded()
    try:
        upstream = args.upstream
        if not upstream:
            port = free_port()
            procs.append(spawn([sys.executable, "-m", "polar_mq.dev.model_server", "--port", str(port),
                                "--max-model-len", "65536", "--token-latency-ms", str(args.token_latency_ms)],
                               f"http://127.0.0.1:{port}/health", logs / "model-server.log"))
            upstream = f"http://127.0.0.1:{port}"
            prompt = "polar:say=" + " ".join(f"word{i % 10}" for i in range(args.words))
        else:
            prompt = args.prompt
        gateways = {}
        for mode, flag in (("streamed", "1"), ("synthetic", "0")):
            port = free_port()
            procs.append(spawn([sys.executable, "-m", "polar_mq.cli", "gateway", "--host", "127.0.0.1",
                                "--port", str(port), "--redis", redis.url, "--workers", "1",
                                "--upstream", upstream],
                               f"http://127.0.0.1:{port}/health", logs / f"gateway-{mode}.log",
                               env={"POLAR_STREAM_PASSTHROUGH": flag, "POLAR_SPOOL_DIR": str(logs / mode)}))
            gateways[mode] = (f"http://127.0.0.1:{port}", procs[-1].pid)
        health = requests.get(f"{gateways['streamed'][0]}/health", timeout=5).json()
        where = (f"stand-in, {args.token_latency_ms:g} ms/token, {args.words} words" if not args.upstream
                 else f"vLLM at {upstream}, max_tokens {args.max_tokens}")
        print(f"upstream: {where}; streams token ids: {health['upstreams'][0].get('stream_token_ids')}; "
              f"{args.n} requests per cell (sequential)\n")
        d_stream = direct(upstream, prompt, args.max_tokens, max(3, args.n // 2), True)
        d_plain = direct(upstream, prompt, args.max_tokens, max(3, args.n // 2), False)
        print(f"upstream alone: streamed TTFC p50 {ms(d_stream[0], .5):.1f} ms / p90 {ms(d_stream[0], .9):.1f} ms, "
              f"total p50 {ms(d_stream[1], .5):.1f} ms; non-streamed total p50 {ms(d_plain[1], .5):.1f} ms\n")
        head = (f"{'provider':<17}{'mode':<10}{'TTFB p50':>9}{'p90':>8}{'TTFC p50':>10}{'p90':>8}"
                f"{'total p50':>11}{'p90':>8}{'frames':>8}{'CPU ms/req':>11}")
        print(head)
        print("-" * len(head))
        ratios = []
        for provider in providers:
            res = {mode: series(provider, gw, pid, prompt, args.max_tokens, args.n)
                   for mode, (gw, pid) in gateways.items()}
            for mode, rows in res.items():
                print(f"{provider:<17}{mode:<10}"
                      f"{ms([r['ttfb'] for r in rows], .5):>9.1f}{ms([r['ttfb'] for r in rows], .9):>8.1f}"
                      f"{ms([r['ttfc'] for r in rows], .5):>10.1f}{ms([r['ttfc'] for r in rows], .9):>8.1f}"
                      f"{ms([r['total'] for r in rows], .5):>11.1f}{ms([r['total'] for r in rows], .9):>8.1f}"
                      f"{pct([r['frames'] for r in rows], .5):>8.0f}{rows[0]['cpu'] * 1000:>11.1f}")
            s, y = res["streamed"], res["synthetic"]
            assert not any(r["synthetic"] for r in s), "the streamed gateway fell back to synthetic"
            assert all(r["synthetic"] for r in y)
            same = all(a["ids"] == b["ids"] for a, b in zip(s, y)) and all(r["status"] == "ok" for r in s + y)
            ratios.append((provider,
                           ms([r["ttfc"] for r in y], .5) / max(ms([r["ttfc"] for r in s], .5), 1e-6),
                           ms([r["total"] for r in y], .5) / max(ms([r["total"] for r in s], .5), 1e-6),
                           same))
        print("\nsynthetic / streamed (p50):")
        print(f"{'provider':<17}{'TTFC ratio':>11}{'total ratio':>12}  same ids in both records")
        for provider, r_first, r_total, same in ratios:
            print(f"{provider:<17}{r_first:>10.1f}x{r_total:>11.2f}x  {'yes' if same else 'NO'}")
    finally:
        stop_all(procs)
        redis.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
