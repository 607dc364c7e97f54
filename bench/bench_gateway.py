"""Per-call overhead of the gateway against calling the upstream directly (and against LiteLLM).

Starts an embedded Redis, the stand-in model server and the gateway (gunicorn as shipped, 1 worker
process), then times sequential requests over keep-alive connections (one session per target, as SDK
clients and harnesses hold them; bodies as compact JSON, as the SDKs and Claude Code send them):
  * a small OpenAI chat request: upstream direct vs through the gateway (and the same request
    streamed from the upstream, for reference: a gateway whose
    upstream cannot abort a request by id streams plain calls internally so that it can abort
    them; the stand-in serves vLLM's dev-mode `/abort_requests`, as an RL deployment's vLLM does),
    and through the floor under any Python gateway here (bare_proxy.py: a gevent process that
    forwards the bytes: alone, with two Redis round trips per call, and with the gateway's own
    Redis I/O in the gateway's order; with their CPU per call);
  * a real recorded Claude Code request (tests/replays/claude_code/anthropic.json, its ~82 KB
    third request: 26 tools, a tool result; sent non-streamed): the chat request the gateway
    would send (the Anthropic adapter's translation) direct vs the Anthropic request through
    the gateway (translation + capture + Redis);
  * a synthetic ~80 KB system-prompt request (same pairing);
  * a long streamed answer (openai chat, `polar:long`): gateway CPU per streamed token;
  * throughput: small calls from 8 client threads for a few seconds;
  * optionally the same through LiteLLM's proxy (Anthropic → the same upstream), when a LiteLLM
    install is given with --litellm-python PATH (its own venv; it is not a project dependency).
Prints p50/p99 latencies, overheads, gateway CPU per call (user+system of the gateway worker
process over the series, from psutil) and the worker's RSS side by side.

With `--baseline REF` (default main) the gateway of that ref (a `git archive`, first on its
PYTHONPATH) runs next to this tree's, against the same stand-in and Redis, and every series
alternates between them in rounds, so both see the same load on a shared box; a last table
prints the headline figures (docs/benchmarks.md) side by side.

    python bench/bench_gateway.py [-n 200] [--baseline main] [--litellm-python /tmp/litellm-venv/bin/python]

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

from polar_mq.cli.embedded_redis import free_port, start_embedded  # noqa: E402
from polar_mq.cli.up import wait_http  # noqa: E402
from polar_mq.auth import auth_headers

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


def stop_all(procs: list[subprocess.Popen], wait: float = 10.0) -> None:
    """Terminate the processes a bench started, then kill whichever is still there after `wait` s."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            proc.kill()


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


class SdkSession(requests.Session):
    """A keep-alive client that sends JSON bodies as the official SDKs (openai, anthropic) and
    Claude Code do: compact and UTF-8. requests' `json=` writes ", " and ": " separators and ASCII
    escapes, which no harness sends (and which the gateway's reuse of known tool definitions,
    fastjson.KnownValues, does not learn from)."""

    def request(self, method, url, *args, json=None, headers=None, **kwargs):  # type: ignore[override]
        if json is not None:
            kwargs["data"] = compact(json)
            headers = {"Content-Type": "application/json", **(headers or {})}
        return super().request(method, url, *args, headers=headers, **kwargs)


def compact(body: Any) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


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
        http = SdkSession()
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


def export_ref(ref: str, dest: Path) -> Path:
    """The polar_mq package of git `ref`, extracted under dest (its gateway imports it first)."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "polar_mq"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def builds(baseline: str, logs: Path) -> list[tuple[str, dict[str, str]]]:
    """The gateways measured side by side: `baseline`'s code (a git archive first on the children's
    PYTHONPATH), then this tree's; each with the environment its processes start with."""
    out: list[tuple[str, dict[str, str]]] = []
    if baseline:
        old = export_ref(baseline, logs / "baseline")
        out.append((f"before ({baseline})", {"PYTHONPATH": str(old)}))
    out.append(("after (this tree)", {}))
    return out


class Target:
    """One gateway under test (the baseline ref's code or this tree's), its worker's CPU and key."""

    def __init__(self, label: str, url: str, cpu: Cpu, key: str, session_id: str):
        self.label, self.url, self.cpu, self.key, self.session_id = label, url, cpu, key, session_id


def interleaved(fns: dict[str, Callable[[], requests.Response]], n: int, rounds: int,
                cpus: dict[str, Cpu | None], warmup: int = 5) -> dict[str, tuple[list[float], float | None]]:
    """n calls per target, in `rounds` alternating blocks (the order rotates each round), so that
    the box's load moves every target alike; per target its latencies and CPU ms per call."""
    for fn in fns.values():
        for _ in range(warmup):
            fn().raise_for_status()
    lat: dict[str, list[float]] = {k: [] for k in fns}
    cpu_s: dict[str, float] = {k: 0.0 for k in fns}
    names = list(fns)
    per = max(1, n // rounds)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            cpu = cpus.get(name)
            c0 = cpu.seconds() if cpu else 0.0
            got, _ = timed(fns[name], per, warmup=0)
            lat[name].extend(got)
            if cpu:
                cpu_s[name] += cpu.seconds() - c0
    return {k: (lat[k], cpu_s[k] * 1000 / len(lat[k]) if cpus.get(k) else None) for k in fns}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=200, help="requests per small-request series")
    ap.add_argument("--n-large", type=int, default=60, help="requests per 80 KB series")
    ap.add_argument("--n-stream", type=int, default=40,
                    help="long streamed answers (20 gave CPU per token within ±20%% run to run)")
    ap.add_argument("--rounds", type=int, default=5, help="alternating blocks per series")
    ap.add_argument("--throughput-seconds", type=float, default=5.0)
    ap.add_argument("--baseline", default="main",
                    help="git ref whose gateway runs side by side with this tree's ('' to skip)")
    ap.add_argument("--litellm-python", help="python of a venv with litellm[proxy] installed")
    ap.add_argument("--gateway-arg", action="append", default=[],
                    help="extra argument for `polar-mq gateway` (repeatable)")
    ap.add_argument("--upstream-prompt-cache", action="store_true",
                    help="the stand-in keeps the ids of prompts it tokenized (model_server "
                    "--prompt-cache): the 82 KB request is answered at once instead of after "
                    "tokenizing on both cores, which slows the gateway's next work on a small VM "
                    "(docs/benchmarks.md)")
    ap.add_argument("--hold", action="store_true", help="print the gateway pid and wait for Enter "
                    "before timing (attach a profiler)")
    args = ap.parse_args()

    from rich.console import Console
    from rich.table import Table

    console = Console(width=170)
    logs = Path(tempfile.mkdtemp(prefix="polar-bench-"))
    procs: list[subprocess.Popen] = []
    redis_server = start_embedded()
    try:
        mport = free_port()
        upstream = f"http://127.0.0.1:{mport}"
        code = builds(args.baseline, logs)
        os.chdir(logs)  # `python -m` puts the cwd first on sys.path: children import what PYTHONPATH says
        targets: list[Target] = []
        with console.status("starting model server and gateway(s)…"):
            procs.append(spawn([sys.executable, "-m", "polar_mq.dev.model_server", "--port", str(mport),
                                "--max-model-len", "65536",
                                *(["--prompt-cache", "64"] if args.upstream_prompt_cache else [])],
                               f"{upstream}/health", logs / "ms.log"))
            for i, (label, env) in enumerate(code):
                gport = free_port()
                procs.append(spawn([sys.executable, "-m", "polar_mq.cli", "gateway", "--port", str(gport),
                                    "--redis", redis_server.url, "--upstream", upstream, "--workers", "1",
                                    *args.gateway_arg],
                                   f"http://127.0.0.1:{gport}/health", logs / f"gw{i}.log", env=env))
                gateway = f"http://127.0.0.1:{gport}"
                session = requests.post(f"{gateway}/sessions", headers=auth_headers(), json={}, timeout=5).json()
                targets.append(Target(label, gateway, Cpu(procs[-1].pid), session["key"], session["session_id"]))
            floors: dict[str, str] = {}  # the floor under any Python gateway here (bare_proxy.py)
            floor_cpus: dict[str, Cpu] = {}  # its CPU per call: the kernel's share of each hop
            for name, extra_args in (("bare gevent proxy", []),
                                     ("bare proxy + 2 Redis trips", ["--redis", redis_server.url]),
                                     ("bare proxy + the gateway's Redis I/O",
                                      ["--redis", redis_server.url, "--redis-mode", "gateway"])):
                fport = free_port()
                procs.append(spawn([sys.executable, str(ROOT / "bench" / "bare_proxy.py"), "--port", str(fport),
                                    "--upstream", upstream, *extra_args], f"http://127.0.0.1:{fport}/",
                                   logs / f"bare{len(floors)}.log"))
                floors[name] = f"http://127.0.0.1:{fport}/v1/chat/completions"
                floor_cpus[f"small: floor, {name}"] = Cpu(procs[-1].pid)
        http = SdkSession()  # keep-alive and compact JSON, as SDK clients
        if args.hold:
            input(f"gateway worker pid(s) {[(t.label, [p.pid for p in t.cpu.workers()]) for t in targets]}; "
                  "Enter to start timing ")

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
        direct_url = f"{upstream}/v1/chat/completions"

        series: dict[str, list[float]] = {}
        cpu_ms: dict[str, float | None] = {}
        groups: list[tuple[str, list[str]]] = []  # (size, series names with the direct one first)

        def run(size: str, n: int, direct: Callable[[], requests.Response],
                through: Callable[[Target], Callable[[], requests.Response]], what: str,
                extra: dict[str, Callable[[], requests.Response]] | None = None,
                extra_cpus: dict[str, Cpu] | None = None) -> None:
            fns: dict[str, Callable[[], requests.Response]] = {f"{size}: upstream direct": direct, **(extra or {})}
            cpus: dict[str, Cpu | None] = {**(extra_cpus or {})}
            for t in targets:
                fns[f"{size}: {what} {t.label}"] = through(t)
                cpus[f"{size}: {what} {t.label}"] = t.cpu
            for name, (lat, c) in interleaved(fns, n, args.rounds, cpus).items():
                series[name], cpu_ms[name] = lat, c
            groups.append((size, list(fns)))

        with console.status("timing…"):
            # A gateway whose upstream cannot abort by id streams plain calls from the upstream
            # (so that it can abort them): what the same call costs the upstream streamed is
            # shown for reference.
            run("small", args.n, lambda: http.post(direct_url, json=direct_body(small_chat)),
                lambda t: lambda: http.post(f"{t.url}/s/{t.key}/v1/chat/completions", json=small_chat),
                "gateway (openai chat)",
                {"small: upstream direct streamed (reference)": lambda: http.post(direct_url, json={
                    **direct_body(small_chat), "stream": True, "stream_options": {"include_usage": True}}),
                 **{f"small: floor, {name}": (lambda u: lambda: http.post(u, json=direct_body(small_chat)))(url)
                    for name, url in floors.items()}}, floor_cpus)
            run("replay 82KB", args.n_large, lambda: http.post(direct_url, json=replay_chat),
                lambda t: lambda: http.post(f"{t.url}/v1/messages", json=replay_anthropic,
                                            headers={"anthropic-version": "2023-06-01", "x-api-key": t.key}),
                "gateway (anthropic)")
            run("80KB", args.n_large, lambda: http.post(direct_url, json=direct_body(large_chat)),
                lambda t: lambda: http.post(f"{t.url}/s/{t.key}/v1/messages", json=large_anthropic),
                "gateway (anthropic)")

            # Streaming: gateway CPU per streamed token over long answers, alternating targets.
            tokens = http.post(direct_url, json={**long_chat, "stream": False}).json()["usage"]["completion_tokens"]
            stream_cpu = {t.label: 0.0 for t in targets}
            stream_wall = {t.label: 0.0 for t in targets}
            for t in targets:
                for _ in range(3):
                    http.post(f"{t.url}/s/{t.key}/v1/chat/completions", json=long_chat).content
            for r in range(args.rounds):
                for t in targets[r % len(targets):] + targets[:r % len(targets)]:
                    c0, t0 = t.cpu.seconds(), time.perf_counter()
                    for _ in range(max(1, args.n_stream // args.rounds)):
                        resp = http.post(f"{t.url}/s/{t.key}/v1/chat/completions", json=long_chat)
                        assert resp.status_code == 200 and b"[DONE]" in resp.content, resp.text[:300]
                    stream_wall[t.label] += time.perf_counter() - t0
                    stream_cpu[t.label] += t.cpu.seconds() - c0
            n_streams = max(1, args.n_stream // args.rounds) * args.rounds
            stream_cpu = {k: v * 1000 / n_streams for k, v in stream_cpu.items()}
            stream_wall = {k: v * 1000 / n_streams for k, v in stream_wall.items()}

            tput_direct = throughput(direct_url, direct_body(small_chat), args.throughput_seconds)
            tput = {t.label: 0.0 for t in targets}
            tput_cpu = {t.label: 0.0 for t in targets}
            for r in range(2):  # two alternating halves each
                for t in targets[r % len(targets):] + targets[:r % len(targets)]:
                    c0, t0 = t.cpu.seconds(), time.perf_counter()
                    tput[t.label] += throughput(f"{t.url}/s/{t.key}/v1/chat/completions", small_chat,
                                                args.throughput_seconds / 2) / 2
                    tput_cpu[t.label] += (t.cpu.seconds() - c0) / (time.perf_counter() - t0) / 2
            rss = {t.label: t.cpu.rss_mib() for t in targets}

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
                lkey = "sk-polar-bench-0123456789abcdef0123456789"
                for name, (lat, c) in interleaved({
                        "small: upstream direct (litellm run)": lambda: http.post(direct_url, json=direct_body(small_chat)),
                        "small: litellm (openai chat)": lambda: http.post(
                            f"{lit}/v1/chat/completions", json=small_chat, headers={"Authorization": f"Bearer {lkey}"})},
                        args.n, args.rounds, {}).items():
                    series[name], cpu_ms[name] = lat, c
                for name, (lat, c) in interleaved({
                        "80KB: upstream direct (litellm run)": lambda: http.post(direct_url, json=direct_body(large_chat)),
                        "80KB: litellm (anthropic)": lambda: http.post(
                            f"{lit}/v1/messages", json=large_anthropic,
                            headers={"x-api-key": lkey, "anthropic-version": "2023-06-01"})},
                        args.n_large, args.rounds, {}).items():
                    series[name], cpu_ms[name] = lat, c
                groups.append(("small", ["small: upstream direct (litellm run)", "small: litellm (openai chat)"]))
                groups.append(("80KB", ["80KB: upstream direct (litellm run)", "80KB: litellm (anthropic)"]))

        recorded = {t.label: http.get(f"{t.url}/sessions/{t.session_id}/calls", headers=auth_headers(),
                                      timeout=60).json()["calls"] for t in targets}
        table = Table(title=f"gateway per-call overhead (sequential, keep-alive, {args.rounds} alternating "
                      f"rounds, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}"
                      f"{', upstream prompt cache' if args.upstream_prompt_cache else ''})", min_width=150)
        for col in ("series", "n", "p50 ms", "p99 ms", "p50 overhead ms", "p99 overhead ms",
                    "p50 ratio", "gateway CPU ms/call"):
            table.add_column(col, justify="left" if col == "series" else "right")
        rows: dict[str, Any] = {}
        for size, names in groups:
            base = series[names[0]]
            b50, b99 = pct(base, .5), pct(base, .99)
            for name in names:
                values = series[name]
                p50, p99 = pct(values, .5), pct(values, .99)
                direct = name == names[0]
                rows[name] = {"n": len(values), "p50_ms": round(p50, 2), "p99_ms": round(p99, 2),
                              "overhead_p50_ms": round(p50 - b50, 2), "overhead_p99_ms": round(p99 - b99, 2),
                              "ratio_p50": round(p50 / b50, 3),
                              "cpu_ms_per_call": None if cpu_ms[name] is None else round(cpu_ms[name], 3)}
                table.add_row(name, str(len(values)), f"{p50:.2f}", f"{p99:.2f}",
                              "—" if direct else f"{p50 - b50:+.2f}", "—" if direct else f"{p99 - b99:+.2f}",
                              "1.00×" if direct else f"{p50 / b50:.2f}×",
                              "—" if cpu_ms[name] is None else f"{cpu_ms[name]:.2f}")
            table.add_section()
        console.print(table)

        goals = Table(title="headline figures, side by side (same run"

                      f"{', upstream prompt cache' if args.upstream_prompt_cache else ''})", min_width=110)
        goals.add_column("goal", justify="left")
        for t in targets:
            goals.add_column(t.label, justify="right")
        goals.add_column("target", justify="right")
        row = lambda what, vals, target: goals.add_row(what, *vals, target)  # noqa: E731
        get = lambda name, t, f: rows[f"{name} {t.label}"][f]  # noqa: E731
        row("small chat overhead p50 ms", [f"{get('small: gateway (openai chat)', t, 'overhead_p50_ms'):+.2f}"
                                           for t in targets], "≤ 1")
        floor = rows["small: floor, bare proxy + 2 Redis trips"]["overhead_p50_ms"]
        row(f"small chat overhead p50 ms above the floor ({floor:+.2f}: bare proxy + 2 Redis trips)",
            [f"{get('small: gateway (openai chat)', t, 'overhead_p50_ms') - floor:+.2f}" for t in targets], "")
        io_floor = rows["small: floor, bare proxy + the gateway's Redis I/O"]["overhead_p50_ms"]
        row(f"small chat overhead p50 ms above the floor ({io_floor:+.2f}: bare proxy + the gateway's Redis I/O)",
            [f"{get('small: gateway (openai chat)', t, 'overhead_p50_ms') - io_floor:+.2f}" for t in targets], "")
        row("small chat gateway CPU ms/call", [f"{get('small: gateway (openai chat)', t, 'cpu_ms_per_call'):.2f}"
                                               for t in targets], "")
        row("82 KB Claude Code overhead p50 ms", [f"{get('replay 82KB: gateway (anthropic)', t, 'overhead_p50_ms'):+.2f}"
                                                  for t in targets], "≤ 5")
        row("82 KB Claude Code gateway CPU ms/call", [f"{get('replay 82KB: gateway (anthropic)', t, 'cpu_ms_per_call'):.2f}"
                                                      for t in targets], "≤ 3")
        row("80 KB synthetic overhead p50 ms", [f"{get('80KB: gateway (anthropic)', t, 'overhead_p50_ms'):+.2f}"
                                                for t in targets], "≤ 5")
        row("80 KB synthetic gateway CPU ms/call", [f"{get('80KB: gateway (anthropic)', t, 'cpu_ms_per_call'):.2f}"
                                                    for t in targets], "")
        row(f"streaming CPU ms/token ({tokens}-token answers)",
            [f"{stream_cpu[t.label] / tokens:.4f}" for t in targets], "≤ 0.05")
        row(f"small calls/s, 8 clients (direct {tput_direct:.0f}/s)", [f"{tput[t.label]:.0f}" for t in targets], "≥ 300")
        row("CPU-bound small calls/s per core", [f"{1000 / get('small: gateway (openai chat)', t, 'cpu_ms_per_call'):.0f}"
                                                 for t in targets], "")
        row("worker RSS MiB", [f"{rss[t.label]:.1f}" for t in targets], "≤ 150")
        row("calls recorded with token ids", [f"{len(recorded[t.label])} "
                                              f"{all(c['prompt_token_ids'] for c in recorded[t.label])}"
                                              for t in targets], "")
        console.print(goals)
        for t in targets:
            rows[f"stream {t.label}"] = {"tokens_per_answer": tokens, "wall_ms_per_answer": round(stream_wall[t.label], 2),
                                         "cpu_ms_per_answer": round(stream_cpu[t.label], 2),
                                         "cpu_ms_per_token": round(stream_cpu[t.label] / tokens, 4)}
            rows[f"throughput {t.label}"] = {"gateway_calls_s": round(tput[t.label], 1),
                                             "gateway_cpu_cores": round(tput_cpu[t.label], 2)}
            rows[f"rss_mib {t.label}"] = round(rss[t.label], 1)
        rows["throughput direct_calls_s"] = round(tput_direct, 1)
        rows["upstream_prompt_cache"] = args.upstream_prompt_cache
        if "80KB: litellm (anthropic)" in series:
            lt = rows["80KB: litellm (anthropic)"]["overhead_p50_ms"]
            console.print(f"80 KB Anthropic overhead: LiteLLM {lt:+.2f} ms")
        print(json.dumps(rows))
    finally:
        stop_all(procs)
        redis_server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
