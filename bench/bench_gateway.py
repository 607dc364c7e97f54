"""Per-call overhead of the gateway against calling the upstream directly (and against LiteLLM).

Starts an embedded Redis, the stand-in model server and the gateway (gunicorn, 1 worker), then
times sequential requests:
  * a small OpenAI chat request: upstream direct vs through the gateway;
  * an ~80 KB Anthropic Messages request (Claude-Code-sized): the equivalent chat request direct
    vs the Anthropic request through the gateway (translation + capture + Redis write);
  * optionally the same through LiteLLM's proxy (Anthropic → the same upstream), when a LiteLLM
    install is given with --litellm-python PATH (its own venv; it is not a project dependency).
Prints p50/p99 latencies and overhead ratios side by side.

    python bench/bench_gateway.py [-n 200] [--litellm-python /tmp/litellm-venv/bin/python]

LiteLLM in its own venv: python3 -m venv /tmp/litellm-venv && /tmp/litellm-venv/bin/pip install "litellm[proxy]"
"""

from __future__ import annotations

import argparse
import json
import os

import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from polar_mq.embedded_redis import free_port, start_embedded  # noqa: E402
from polar_mq.up import wait_http  # noqa: E402
from polar_mq.tokens import auth_headers

SYSTEM_80K = ("You are an agent working in a repository. Follow the instructions carefully, use the "
              "tools provided, and report what you changed. ") * 600  # ~80 KB


def spawn(args: list[str], health: str, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    proc = subprocess.Popen(args, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                            env={**os.environ, **(env or {})}, start_new_session=True)
    try:
        wait_http(health, proc, timeout=180)
    except RuntimeError as exc:
        proc.kill()
        raise SystemExit(f"{exc}; see {log}") from None
    return proc


def timed(fn: Callable[[], requests.Response], n: int, warmup: int = 5) -> list[float]:
    for _ in range(warmup):
        fn().raise_for_status()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        resp = fn()
        out.append((time.perf_counter() - t0) * 1000)
        if resp.status_code != 200:
            raise SystemExit(f"request failed: {resp.status_code} {resp.text[:300]}")
    return out


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=200, help="requests per small-request series")
    ap.add_argument("--n-large", type=int, default=60, help="requests per 80 KB series")
    ap.add_argument("--litellm-python", help="python of a venv with litellm[proxy] installed")
    args = ap.parse_args()

    from rich.console import Console
    from rich.table import Table

    console = Console()
    logs = Path(tempfile.mkdtemp(prefix="polar-bench-"))
    procs: list[subprocess.Popen] = []
    redis_server = start_embedded()
    try:
        mport, gport = free_port(), free_port()
        upstream = f"http://127.0.0.1:{mport}"
        with console.status("starting model server and gateway…"):
            procs.append(spawn([sys.executable, "-m", "polar_mq.model_server", "--port", str(mport),
                                "--max-model-len", "65536"], f"{upstream}/health", logs / "ms.log"))
            procs.append(spawn([sys.executable, "-m", "polar_mq.cli", "gateway", "--port", str(gport),
                                "--redis", redis_server.url, "--upstream", upstream, "--workers", "1"],
                               f"http://127.0.0.1:{gport}/health", logs / "gw.log"))
        gateway = f"http://127.0.0.1:{gport}"
        session = requests.post(f"{gateway}/sessions", headers=auth_headers(), json={}, timeout=5).json()
        key = session["key"]
        http = requests.Session()

        small_chat = {"model": "stand-in", "max_tokens": 16,
                      "messages": [{"role": "user", "content": "Say hello polar:notool"}]}
        large_chat = {"model": "stand-in", "max_tokens": 16,
                      "messages": [{"role": "system", "content": SYSTEM_80K},
                                   {"role": "user", "content": "Say hello polar:notool"}]}
        large_anthropic = {"model": "claude-policy", "max_tokens": 16, "system": SYSTEM_80K,
                           "messages": [{"role": "user", "content": "Say hello polar:notool"}]}
        assert len(json.dumps(large_anthropic)) > 75_000
        direct_body = lambda b: {**b, "logprobs": True, "return_token_ids": True}  # noqa: E731

        series: dict[str, list[float]] = {}
        with console.status("timing…"):
            series["small: upstream direct"] = timed(
                lambda: http.post(f"{upstream}/v1/chat/completions", json=direct_body(small_chat)), args.n)
            series["small: gateway (openai chat)"] = timed(
                lambda: http.post(f"{gateway}/s/{key}/v1/chat/completions", json=small_chat), args.n)
            series["80KB: upstream direct"] = timed(
                lambda: http.post(f"{upstream}/v1/chat/completions", json=direct_body(large_chat)), args.n_large)
            series["80KB: gateway (anthropic)"] = timed(
                lambda: http.post(f"{gateway}/s/{key}/v1/messages", json=large_anthropic), args.n_large)

            if args.litellm_python:
                lport = free_port()
                config = logs / "litellm.yaml"
                config.write_text(
                    "model_list:\n"
                    "  - model_name: claude-policy\n"
                    "    litellm_params:\n"
                    f"      model: hosted_vllm/stand-in\n      api_base: {upstream}/v1\n"
                    "  - model_name: stand-in\n"
                    "    litellm_params:\n"
                    f"      model: hosted_vllm/stand-in\n      api_base: {upstream}/v1\n"
                    "litellm_settings:\n  telemetry: false\n")
                procs.append(spawn([args.litellm_python, "-m", "litellm.proxy.proxy_cli", "--config",
                                    str(config), "--port", str(lport), "--host", "127.0.0.1", "--num_workers", "1"],
                                   f"http://127.0.0.1:{lport}/health/liveliness", logs / "litellm.log",
                                   env={"LITELLM_TELEMETRY": "False", "LITELLM_LOG": "ERROR",
                                        "LITELLM_MASTER_KEY": "sk-polar-bench-0123456789abcdef0123456789"}))
                lit = f"http://127.0.0.1:{lport}"
                series["small: litellm (openai chat)"] = timed(
                    lambda: http.post(f"{lit}/v1/chat/completions", json=small_chat,
                                      headers={"Authorization": "Bearer sk-polar-bench-0123456789abcdef0123456789"}), args.n)
                series["80KB: litellm (anthropic)"] = timed(
                    lambda: http.post(f"{lit}/v1/messages", json=large_anthropic,
                                      headers={"x-api-key": "sk-polar-bench-0123456789abcdef0123456789",
                                               "anthropic-version": "2023-06-01"}),
                    args.n_large)

        calls = http.get(f"{gateway}/sessions/{session['session_id']}/calls", headers=auth_headers(), timeout=30).json()["calls"]
        table = Table(title=f"gateway per-call overhead (sequential, {os.cpu_count()} cores)")
        for col in ("series", "n", "p50 ms", "p99 ms", "p50 overhead ms", "p50 ratio vs direct"):
            table.add_column(col, justify="left" if col == "series" else "right")
        rows: dict[str, Any] = {}
        for name, values in series.items():
            size = name.split(":")[0]
            base = series[f"{size}: upstream direct"]
            p50, p99, b50 = pct(values, .5), pct(values, .99), pct(base, .5)
            rows[name] = {"n": len(values), "p50_ms": round(p50, 2), "p99_ms": round(p99, 2),
                          "overhead_p50_ms": round(p50 - b50, 2), "ratio_p50": round(p50 / b50, 3)}
            table.add_row(name, str(len(values)), f"{p50:.2f}", f"{p99:.2f}",
                          "—" if "direct" in name else f"{p50 - b50:+.2f}",
                          "1.00×" if "direct" in name else f"{p50 / b50:.2f}×")
        console.print(table)
        if "80KB: litellm (anthropic)" in series:
            g = rows["80KB: gateway (anthropic)"]["overhead_p50_ms"]
            lt = rows["80KB: litellm (anthropic)"]["overhead_p50_ms"]
            console.print(f"80 KB Anthropic overhead: polar_mq {g:.2f} ms vs LiteLLM {lt:.2f} ms "
                          f"({lt / g if g > 0 else float('inf'):.1f}× less overhead)")
        console.print(f"gateway recorded {len(calls)} calls with token ids: "
                      f"{all(c['prompt_token_ids'] for c in calls)}")
        print(json.dumps(rows))
    finally:
        for p in procs:
            p.terminate()
        redis_server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
