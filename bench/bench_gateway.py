"""Per-call overhead of the gateway against calling the upstream directly (and against LiteLLM).

Starts an embedded Redis, the stand-in model server and the gateway (gunicorn as shipped, 1 worker
process), then times sequential requests over keep-alive connections (one `requests.Session` per
target, as SDK clients and harnesses hold them):
  * a small OpenAI chat request: upstream direct vs through the gateway (and the same request
    streamed from the upstream, for reference: the gateway streams plain calls internally so
    that it can abort them);
  * a real recorded Claude Code request (tests/replays/claude_code/anthropic.json, its ~82 KB
    third request: 26 tools, a tool result; sent non-streamed): the chat request the gateway
    would send (the Anthropic adapter's translation) direct vs the Anthropic request through
    the gateway (translation + capture + Redis);
  * the synthetic ~80 KB system-prompt request of earlier runs (same pairing);
  * a long streamed answer (openai chat, `polar:long`): gateway CPU per streamed token;
  * throughput: small calls from 8 client threads for a few seconds;
  * optionally the same through LiteLLM's proxy (Anthropic → the same upstream), when a LiteLLM
    install is given with --litellm-python PATH (its own venv; it is not a project dependency).
Prints p50/p99 latencies, overheads, gateway CPU per call (user+system of the gateway worker
process over the series, from psutil) and the worker's RSS side by side.

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


REPLAY = ROOT / "tests" / "replays" / "claude_code" / "anthropic.json"


def replay_request(path: Path = REPLAY) -> dict[str, Any]:
    """The largest recorded generation request of a real Claude Code run, sent non-streamed."""
    recorded = json.loads(path.read_text())["requests"]
    body = max((r["body"] for r in recorded if r.get("generation")), key=lambda b: len(json.dumps(b)))
    return {**body, "stream": False}


def chat_equivalent(anthropic_body: dict[str, Any]) -> dict[str, Any]:
    """The chat request the gateway sends upstream for an Anthropic request (the direct baseline)."""
    from polar_mq.proxy_app.adapters import anthropic

    req = anthropic.to_chat(anthropic_body)
    body = {"model": "stand-in", "messages": req.messages, **req.params, "stream": False,
            "logprobs": True, "return_token_ids": True}
    if req.tools:
        body["tools"] = req.tools
    return body


class Cpu:
    """User+system CPU seconds of the gateway's worker processes (gunicorn children)."""

    def __init__(self, pid: int):
        import psutil

        self.root = psutil.Process(pid)

    def workers(self) -> list:
        kids = self.root.children(recursive=True)
        return kids or [self.root]

    def seconds(self) -> float:
        total = 0.0
        for proc in self.workers():
            t = proc.cpu_times()
            total += t.user + t.system
        return total

    def rss_mib(self) -> float:
        return max(p.memory_info().rss for p in self.workers()) / 2 ** 20


def timed(fn: Callable[[], requests.Response], n: int, warmup: int = 5,
          cpu: Cpu | None = None) -> tuple[list[float], float | None]:
    """Latencies (ms) of n sequential calls, and the gateway CPU ms per call over them."""
    for _ in range(warmup):
        fn().raise_for_status()
    out = []
    c0 = cpu.seconds() if cpu else 0.0
    for _ in range(n):
        t0 = time.perf_counter()
        resp = fn()
        out.append((time.perf_counter() - t0) * 1000)
        if resp.status_code != 200:
            raise SystemExit(f"request failed: {resp.status_code} {resp.text[:300]}")
    return out, ((cpu.seconds() - c0) * 1000 / n if cpu else None)


def throughput(url: str, body: dict[str, Any], seconds: float, threads: int = 8,
               headers: dict[str, str] | None = None) -> float:
    """Calls per second from `threads` keep-alive clients, each calling back to back."""
    import threading

    done = [0] * threads
    stop = time.perf_counter() + seconds

    def client(i: int) -> None:
        http = requests.Session()
        while time.perf_counter() < stop:
            resp = http.post(url, json=body, headers=headers)
            if resp.status_code != 200:
                raise SystemExit(f"request failed: {resp.status_code} {resp.text[:300]}")
            done[i] += 1

    t0 = time.perf_counter()
    workers = [threading.Thread(target=client, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(done) / (time.perf_counter() - t0)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=200, help="requests per small-request series")
    ap.add_argument("--n-large", type=int, default=60, help="requests per 80 KB series")
    ap.add_argument("--n-stream", type=int, default=20, help="long streamed answers")
    ap.add_argument("--throughput-seconds", type=float, default=5.0)
    ap.add_argument("--litellm-python", help="python of a venv with litellm[proxy] installed")
    ap.add_argument("--gateway-arg", action="append", default=[],
                    help="extra argument for `polar-mq gateway` (repeatable)")
    ap.add_argument("--hold", action="store_true", help="print the gateway pid and wait for Enter "
                    "before timing (attach py-spy)")
    args = ap.parse_args()

    from rich.console import Console
    from rich.table import Table

    console = Console(width=170)
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
                                "--redis", redis_server.url, "--upstream", upstream, "--workers", "1",
                                *args.gateway_arg],
                               f"http://127.0.0.1:{gport}/health", logs / "gw.log"))
        cpu = Cpu(procs[-1].pid)
        gateway = f"http://127.0.0.1:{gport}"
        session = requests.post(f"{gateway}/sessions", headers=auth_headers(), json={}, timeout=5).json()
        key = session["key"]
        http = requests.Session()  # keep-alive, as SDK clients
        if args.hold:
            input(f"gateway worker pid(s) {[p.pid for p in cpu.workers()]}; Enter to start timing ")

        small_chat = {"model": "stand-in", "max_tokens": 16,
                      "messages": [{"role": "user", "content": "Say hello polar:notool"}]}
        large_chat = {"model": "stand-in", "max_tokens": 16,
                      "messages": [{"role": "system", "content": SYSTEM_80K},
                                   {"role": "user", "content": "Say hello polar:notool"}]}
        large_anthropic = {"model": "claude-policy", "max_tokens": 16, "system": SYSTEM_80K,
                           "messages": [{"role": "user", "content": "Say hello polar:notool"}]}
        replay_anthropic = replay_request()
        replay_chat = chat_equivalent(replay_anthropic)
        long_chat = {"model": "stand-in", "max_tokens": 512, "stream": True,
                     "messages": [{"role": "user", "content": "Talk polar:long polar:notool"}]}
        assert len(json.dumps(large_anthropic)) > 75_000 and len(json.dumps(replay_anthropic)) > 75_000
        direct_body = lambda b: {**b, "logprobs": True, "return_token_ids": True}  # noqa: E731
        anthropic_headers = {"anthropic-version": "2023-06-01", "x-api-key": key}

        series: dict[str, list[float]] = {}
        cpu_ms: dict[str, float | None] = {}

        def run(name: str, fn: Callable[[], requests.Response], n: int, measure: bool = False) -> None:
            series[name], cpu_ms[name] = timed(fn, n, cpu=cpu if measure else None)

        with console.status("timing…"):
            run("small: upstream direct",
                lambda: http.post(f"{upstream}/v1/chat/completions", json=direct_body(small_chat)), args.n)
            # The gateway streams plain calls from the upstream too (so that it can abort them):
            # this is what the same call costs the upstream streamed, for reference.
            run("small: upstream direct streamed (reference)",
                lambda: http.post(f"{upstream}/v1/chat/completions", json={
                    **direct_body(small_chat), "stream": True, "stream_options": {"include_usage": True}}),
                args.n)
            run("small: gateway (openai chat)",
                lambda: http.post(f"{gateway}/s/{key}/v1/chat/completions", json=small_chat), args.n, True)
            run("replay 82KB: upstream direct",
                lambda: http.post(f"{upstream}/v1/chat/completions", json=replay_chat), args.n_large)
            run("replay 82KB: gateway (anthropic)",
                lambda: http.post(f"{gateway}/v1/messages", json=replay_anthropic, headers=anthropic_headers),
                args.n_large, True)
            run("80KB: upstream direct",
                lambda: http.post(f"{upstream}/v1/chat/completions", json=direct_body(large_chat)), args.n_large)
            run("80KB: gateway (anthropic)",
                lambda: http.post(f"{gateway}/s/{key}/v1/messages", json=large_anthropic), args.n_large, True)

            # Streaming: gateway CPU per streamed token over long answers.
            tokens = http.post(f"{upstream}/v1/chat/completions",
                               json={**long_chat, "stream": False}).json()["usage"]["completion_tokens"]
            for _ in range(3):
                http.post(f"{gateway}/s/{key}/v1/chat/completions", json=long_chat).content
            c0 = cpu.seconds()
            t0 = time.perf_counter()
            for _ in range(args.n_stream):
                resp = http.post(f"{gateway}/s/{key}/v1/chat/completions", json=long_chat)
                assert resp.status_code == 200 and b"[DONE]" in resp.content, resp.text[:300]
            stream_wall = (time.perf_counter() - t0) / args.n_stream * 1000
            stream_cpu = (cpu.seconds() - c0) * 1000 / args.n_stream

            tput_direct = throughput(f"{upstream}/v1/chat/completions", direct_body(small_chat),
                                     args.throughput_seconds)
            c0 = cpu.seconds()
            t0 = time.perf_counter()
            tput = throughput(f"{gateway}/s/{key}/v1/chat/completions", small_chat, args.throughput_seconds)
            tput_cpu = (cpu.seconds() - c0) / (time.perf_counter() - t0)
            rss = cpu.rss_mib()

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
                run("small: litellm (openai chat)",
                    lambda: http.post(f"{lit}/v1/chat/completions", json=small_chat,
                                      headers={"Authorization": "Bearer sk-polar-bench-0123456789abcdef0123456789"}), args.n)
                run("80KB: litellm (anthropic)",
                    lambda: http.post(f"{lit}/v1/messages", json=large_anthropic,
                                      headers={"x-api-key": "sk-polar-bench-0123456789abcdef0123456789",
                                               "anthropic-version": "2023-06-01"}),
                    args.n_large)

        calls = http.get(f"{gateway}/sessions/{session['session_id']}/calls", headers=auth_headers(), timeout=30).json()["calls"]
        table = Table(title=f"gateway per-call overhead (sequential, keep-alive, {os.cpu_count()} cores)",
                      min_width=150)
        for col in ("series", "n", "p50 ms", "p99 ms", "p50 overhead ms", "p99 overhead ms",
                    "p50 ratio", "gateway CPU ms/call"):
            table.add_column(col, justify="left" if col == "series" else "right")
        rows: dict[str, Any] = {}
        for name, values in series.items():
            size = name.split(":")[0]
            base = series[f"{size}: upstream direct"]
            p50, p99, b50, b99 = pct(values, .5), pct(values, .99), pct(base, .5), pct(base, .99)
            direct = name.endswith("upstream direct")
            rows[name] = {"n": len(values), "p50_ms": round(p50, 2), "p99_ms": round(p99, 2),
                          "overhead_p50_ms": round(p50 - b50, 2), "overhead_p99_ms": round(p99 - b99, 2),
                          "ratio_p50": round(p50 / b50, 3),
                          "cpu_ms_per_call": None if cpu_ms[name] is None else round(cpu_ms[name], 3)}
            table.add_row(name, str(len(values)), f"{p50:.2f}", f"{p99:.2f}",
                          "—" if direct else f"{p50 - b50:+.2f}", "—" if direct else f"{p99 - b99:+.2f}",
                          "1.00×" if direct else f"{p50 / b50:.2f}×",
                          "—" if cpu_ms[name] is None else f"{cpu_ms[name]:.2f}")
        console.print(table)
        rows["stream"] = {"tokens_per_answer": tokens, "wall_ms_per_answer": round(stream_wall, 2),
                          "cpu_ms_per_answer": round(stream_cpu, 2),
                          "cpu_ms_per_token": round(stream_cpu / tokens, 4)}
        rows["throughput"] = {"direct_calls_s": round(tput_direct, 1), "gateway_calls_s": round(tput, 1),
                              "gateway_cpu_cores": round(tput_cpu, 2),
                              "gateway_capacity_calls_s_per_core": round(
                                  1000 / cpu_ms["small: gateway (openai chat)"], 1)}
        rows["rss_mib"] = round(rss, 1)
        console.print(f"streamed answer of {tokens} tokens: gateway CPU {stream_cpu:.2f} ms "
                      f"({stream_cpu / tokens:.4f} ms/token), wall {stream_wall:.1f} ms")
        console.print(f"throughput, 8 keep-alive clients, small chat: direct {tput_direct:.0f}/s, "
                      f"gateway {tput:.0f}/s (gateway worker busy {tput_cpu:.2f} cores; CPU-bound "
                      f"capacity {1000 / cpu_ms['small: gateway (openai chat)']:.0f} calls/s per core)")
        console.print(f"gateway worker RSS {rss:.1f} MiB")
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
