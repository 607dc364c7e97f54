#!/usr/bin/env python3
"""Record what the real agent CLIs send, as replay fixtures for tests/adapters/test_replays.py.

Each harness (optionally with a wire API: ``pi:anthropic``) runs headless through the gateway
against the stand-in model with the task "write a file via a tool, then finish".  A small
recording proxy sits between the CLI and the gateway and keeps every request exactly as the CLI
sent it (method, path, the headers that matter, body) plus the gateway's status.  The session key
is replaced by ``REPLAY_KEY`` everywhere.  One JSON file per (harness, api, scenario) is written
to ``tests/replays/<harness>/<api>.json`` (scenario ``basic``) or ``<api>.<scenario>.json``.
Scenarios (see ``SCENARIOS``): ``basic``; ``think_parallel`` (reasoning on every turn, two
parallel tool calls); ``router`` (Gemini CLI only: no pinned model, so it sends its non-streaming
router call first).

Usage::

    .venv/bin/python scripts/record_replays.py                   # all harnesses, all their APIs
    .venv/bin/python scripts/record_replays.py pi codex:openai_responses --scenario basic
    .venv/bin/python scripts/record_replays.py --gateway http://127.0.0.1:8600 --out DIR

Without ``--gateway`` it starts its own stand-in model server and gateway (with an embedded
Redis).  The CLIs are installed into the harness cache when missing.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import http.client
import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from polar_mq import harnesses  # noqa: E402
from polar_mq.harnesses import install  # noqa: E402
from polar_mq.cli.up import wait_http  # noqa: E402
from polar_mq.auth import auth_headers

REPLAY_KEY = "REPLAY_KEY"
MODEL = "stand-in"
#: Scenario name -> instruction (``{path}``: absolute path of the file to create).  The stand-in
#: model reads the ``polar:`` directives; ``think`` adds reasoning to every turn (so the CLIs echo
#: thinking/reasoning items back), ``parallel`` makes the first turn two tool calls.
SCENARIOS = {
    "basic": "Create the file polar.txt polar:path={path}",
    "think_parallel": "Create the file polar.txt polar:path={path} polar:think polar:parallel",
    # Gemini CLI without a pinned model: it first sends its non-streaming router/classifier call
    # (``:generateContent`` with ``responseJsonSchema``) before the streaming turns.
    "router": "Create the file polar.txt polar:path={path}",
}
#: Scenarios that apply to some harnesses only (default: all harnesses).
SCENARIO_HARNESSES = {"router": {"gemini_cli"}}


def tweak_launch(scenario: str, launch: harnesses.CliLaunch, home: Path) -> None:
    """Per-scenario changes to the standard config (in place)."""
    if scenario == "router" and launch.harness == "gemini_cli":
        i = launch.argv.index("-m")
        del launch.argv[i:i + 2]
        launch.env.pop("GEMINI_MODEL", None)
        settings_path = home / ".gemini" / "settings.json"
        settings = json.loads(settings_path.read_text())
        settings.pop("model", None)
        settings_path.write_text(json.dumps(settings, indent=2))
#: Request headers kept in the fixtures (auth headers are kept with the key replaced).
KEEP_HEADERS = (
    "anthropic-version", "anthropic-beta", "content-type", "accept", "user-agent",
    "x-api-key", "authorization", "x-goog-api-key", "x-stainless-retry-count",
    "openai-beta", "x-goog-api-client",
)
GENERATION_RE = re.compile(
    r"/v1/messages(\?|$)|/v1/chat/completions(\?|$)|/v1/responses(\?|$)"
    r"|:generateContent(\?|$)|:streamGenerateContent(\?|$)"
)


def is_generation(method: str, path: str) -> bool:
    """True for a POST that produces a model call (count_tokens etc. excluded)."""
    return method == "POST" and bool(GENERATION_RE.search(path)) and "count_tokens" not in path \
        and ":countTokens" not in path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------------
# Recording proxy: forwards to the gateway, streams the answer back, keeps each request.
# ------------------------------------------------------------------------------------------
class RecordingProxy:
    def __init__(self, target: str):
        u = urllib.parse.urlsplit(target)
        self.target_host, self.target_port = u.hostname, u.port or 80
        self.entries: List[Dict[str, Any]] = []
        self.lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # quiet
                pass

            def _body(self) -> bytes:
                if self.headers.get("transfer-encoding", "").lower() == "chunked":
                    out = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return out
                        out += self.rfile.read(size)
                        self.rfile.readline()
                n = int(self.headers.get("content-length") or 0)
                return self.rfile.read(n) if n else b""

            def _forward(self):
                body = self._body()
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("host", "content-length", "transfer-encoding",
                                                "connection", "accept-encoding")}
                headers["Accept-Encoding"] = "identity"
                conn = http.client.HTTPConnection(proxy.target_host, proxy.target_port, timeout=300)
                status, ctype = 502, ""
                try:
                    conn.request(self.command, self.path, body=body or None, headers=headers)
                    resp = conn.getresponse()
                    status, ctype = resp.status, resp.getheader("content-type", "")
                    self.send_response(resp.status)
                    for k, v in resp.getheaders():
                        if k.lower() not in ("transfer-encoding", "content-length", "connection",
                                             "date", "server"):
                            self.send_header(k, v)
                    head_only = self.command == "HEAD" or resp.status in (204, 304)
                    if head_only:
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                    else:
                        self.send_header("Transfer-Encoding", "chunked")
                        self.end_headers()
                        while True:
                            chunk = resp.read1(65536)
                            if not chunk:
                                break
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                            self.wfile.flush()
                        self.wfile.write(b"0\r\n\r\n")
                        self.wfile.flush()
                except (ConnectionError, OSError) as exc:
                    try:
                        self.send_error(502, str(exc))
                    except OSError:
                        pass
                finally:
                    conn.close()
                    proxy.record(self.command, self.path, dict(self.headers.items()), body,
                                 status, ctype)

            do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = do_OPTIONS = _forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def record(self, method, path, headers, body, status, ctype):
        with self.lock:
            self.entries.append({"t": time.time(), "method": method, "path": path,
                                 "headers": headers, "body": body, "status": status,
                                 "content_type": ctype})

    def take(self) -> List[Dict[str, Any]]:
        with self.lock:
            out, self.entries = self.entries, []
        return sorted(out, key=lambda e: e["t"])

    def close(self):
        self.server.shutdown()
        self.server.server_close()


# ------------------------------------------------------------------------------------------
# Stack: stand-in model server + gateway (embedded Redis)
# ------------------------------------------------------------------------------------------
def _wait(url: str, proc: subprocess.Popen, log: Path, timeout: float = 90.0) -> None:
    try:
        wait_http(url, proc, timeout)
    except RuntimeError as exc:
        raise RuntimeError(f"{exc}\n{log.read_text(errors='replace')[-3000:]}") from None


def start_stack(logdir: Path, *, max_model_len: int = 131072,
                model_server_args: Tuple[str, ...] = ()) -> Tuple[str, List[subprocess.Popen]]:
    """The stand-in model server and a gateway in front of it: (gateway URL, processes)."""
    procs: List[subprocess.Popen] = []
    ms_port, gw_port = free_port(), free_port()
    ms_log, gw_log = logdir / "model-server.log", logdir / "gateway.log"
    ms = subprocess.Popen([sys.executable, "-m", "polar_mq.dev.model_server", "--host", "127.0.0.1",
                           "--port", str(ms_port), "--max-model-len", str(max_model_len),
                           *model_server_args],
                          stdout=open(ms_log, "wb"), stderr=subprocess.STDOUT, cwd=ROOT,
                          start_new_session=True)
    procs.append(ms)
    _wait(f"http://127.0.0.1:{ms_port}/health", ms, ms_log)
    gw = subprocess.Popen([sys.executable, "-m", "polar_mq.cli", "gateway", "--host", "127.0.0.1",
                           "--port", str(gw_port), "--upstream", f"http://127.0.0.1:{ms_port}",
                           "--workers", "1"],
                          stdout=open(gw_log, "wb"), stderr=subprocess.STDOUT, cwd=ROOT,
                          env={**os.environ, "POLAR_SPOOL_DIR": str(logdir / "spool")},
                          start_new_session=True)
    procs.append(gw)
    _wait(f"http://127.0.0.1:{gw_port}/health", gw, gw_log)
    return f"http://127.0.0.1:{gw_port}", procs


def stop_stack(procs: List[subprocess.Popen]) -> None:
    for p in reversed(procs):
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


# ------------------------------------------------------------------------------------------
# One recording
# ------------------------------------------------------------------------------------------
def scrub(text: str, key: str) -> str:
    return text.replace(key, REPLAY_KEY)


def to_fixture_entry(e: Dict[str, Any], key: str) -> Dict[str, Any]:
    headers = {k.lower(): scrub(v, key) for k, v in e["headers"].items()
               if k.lower() in KEEP_HEADERS}
    raw = scrub(e["body"].decode("utf-8", errors="replace"), key) if e["body"] else ""
    try:
        body: Any = json.loads(raw) if raw else None
        body_format = "json"
    except ValueError:
        body, body_format = raw, "text"
    path = scrub(e["path"], key)
    stream = None
    if isinstance(body, dict) and "stream" in body:
        stream = bool(body["stream"])
    if ":streamGenerateContent" in path:
        stream = True
    elif ":generateContent" in path:
        stream = False
    return {
        "method": e["method"],
        "path": path,
        "headers": headers,
        "body_format": body_format,
        "body": body,
        "stream": stream,
        "generation": is_generation(e["method"], path),
        "recorded_status": e["status"],
        "recorded_content_type": e["content_type"],
    }


def record_one(harness: str, api: str, gateway: str, proxy: RecordingProxy, out_dir: Path,
               timeout: float, scenario: str = "basic") -> Dict[str, Any]:
    bin_path = install.install([harness])[harness]
    sess = requests.post(f"{gateway}/sessions", headers=auth_headers(), json={"metadata": {"recording": harness, "api": api}},
                         timeout=10).json()
    key = sess["key"]
    base_urls = {k: v.replace(gateway, proxy.url) for k, v in sess["base_urls"].items()}
    tmp = Path(tempfile.mkdtemp(prefix=f"polar-replay-{harness}-"))
    home, work = tmp / "home", tmp / "work"
    work.mkdir(parents=True)
    target = work / "polar.txt"
    # Absolute path: Qwen Code's write tool rejects relative ones.
    instruction = SCENARIOS[scenario].format(path=target)
    launch = harnesses.build(harness, home, base_urls, key, MODEL, instruction, api=api, bin=bin_path)
    tweak_launch(scenario, launch, home)
    proxy.take()
    t0 = time.time()
    try:
        proc = subprocess.run(launch.argv, env={**os.environ, **launch.env}, cwd=work,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout)
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc = None
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
    secs = time.time() - t0
    time.sleep(0.5)  # let late side requests land
    entries = proxy.take()
    calls = requests.get(f"{gateway}/sessions/{sess['session_id']}/calls", headers=auth_headers(), timeout=10).json()["calls"]
    file_ok = target.exists() and target.read_text().strip() == "hello from polar"
    multi_turn = any(m.get("role") == "tool" for c in calls for m in (c.get("messages") or []))
    version = install.PACKAGES[harness].version
    fixture = {
        "harness": harness,
        "package": install.PACKAGES[harness].spec,
        "version": version,
        "api": api,
        "scenario": scenario,
        "model": MODEL,
        "instruction": scrub(instruction, key),
        "recorded_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "outcome": {
            "exit_code": rc,
            "seconds": round(secs, 1),
            "file_written": file_ok,
            "multi_turn": multi_turn,
            "capture_records": len(calls),
            "finish_reasons": [c.get("finish_reason") for c in calls],
            "stdout_tail": scrub(out[-400:], key),
        },
        "requests": [to_fixture_entry(e, key) for e in entries],
    }
    dest = out_dir / harness / (f"{api}.json" if scenario == "basic" else f"{api}.{scenario}.json")
    dest.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(fixture, indent=1, ensure_ascii=False)
    assert key not in text
    dest.write_text(text + "\n")
    shutil.rmtree(tmp, ignore_errors=True)
    summary = {"harness": harness, "api": api, "scenario": scenario, "file": str(dest.relative_to(ROOT)
                                                          if dest.is_relative_to(ROOT) else dest),
               **{k: v for k, v in fixture["outcome"].items() if k != "stdout_tail"},
               "requests": [f"{r['method']} {r['path'].split('REPLAY_KEY')[-1]} -> {r['recorded_status']}"
                            for r in fixture["requests"]]}
    if rc != 0 or not file_ok:
        summary["stderr_tail"] = scrub(err[-1500:], key)
        summary["stdout_tail"] = scrub(out[-800:], key)
    return summary


def all_targets() -> List[Tuple[str, str]]:
    return [(h, a) for h, apis in harnesses.supported_apis().items() for a in apis]


def parse_targets(specs: List[str]) -> List[Tuple[str, str]]:
    if not specs:
        return all_targets()
    out = []
    for s in specs:
        h, _, a = s.partition(":")
        if h not in harnesses.supported_apis():
            raise SystemExit(f"unknown harness {h!r}")
        out += [(h, a)] if a else [(h, x) for x in harnesses.supported_apis()[h]]
    return out


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("targets", nargs="*", help="HARNESS or HARNESS:API (default: all)")
    ap.add_argument("--gateway", help="use this running gateway instead of starting one")
    ap.add_argument("--out", default=str(ROOT / "tests" / "replays"))
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds per CLI run")
    ap.add_argument("--scenario", action="append", choices=sorted(SCENARIOS) + ["all"],
                    help="scenario(s) to record (default: all)")
    args = ap.parse_args(argv)
    scenarios = list(SCENARIOS) if not args.scenario or "all" in args.scenario else args.scenario
    targets = [(h, a, sc) for h, a in parse_targets(args.targets) for sc in scenarios
               if h in SCENARIO_HARNESSES.get(sc, {h})]
    logdir = Path(tempfile.mkdtemp(prefix="polar-record-"))
    procs: List[subprocess.Popen] = []
    gateway = args.gateway
    if not gateway:
        gateway, procs = start_stack(logdir)
    proxy = RecordingProxy(gateway)
    failed = 0
    try:
        for h, a, sc in targets:
            try:
                s = record_one(h, a, gateway, proxy, Path(args.out), args.timeout, sc)
            except Exception as exc:  # keep going; report at the end
                s = {"harness": h, "api": a, "scenario": sc, "error": repr(exc)}
            ok = s.get("exit_code") == 0 and s.get("file_written") and s.get("multi_turn")
            failed += not ok
            print(json.dumps(s, indent=1), flush=True)
    finally:
        proxy.close()
        stop_stack(procs)
    print(f"recorded {len(targets) - failed}/{len(targets)} complete round trips; logs in {logdir}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
