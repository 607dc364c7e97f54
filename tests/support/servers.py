"""Session fixtures: a real redis-server, the stand-in model server and the gateway, each a real
process on a free port. Tests talk to them over HTTP with the official SDKs.

Tokens: every service requires one (polar_mq.auth). The test run has ONE token, `TOKEN`, set
here as POLAR_API_TOKEN / POLAR_GATEWAY_TOKEN for this process and every process the fixtures
start (and POLAR_HOME points at a private directory, so nothing writes ~/.config). Tests send it
as `AUTH` (also `gateway.admin_headers`); polar_mq.client.Client picks it up by itself."""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from polar_mq.cli.embedded_redis import free_port
from polar_mq.cli.up import wait_http  # noqa: F401  (tests import it from here)


ROOT = Path(__file__).resolve().parents[2]

TOKEN = os.environ.get("POLAR_TEST_TOKEN") or "pmqt-test-" + secrets.token_hex(12)

AUTH = {"Authorization": f"Bearer {TOKEN}"}

if os.environ.get("POLAR_TEST_TOKEN") != TOKEN:
    os.environ["POLAR_TEST_TOKEN"] = TOKEN
    os.environ["POLAR_HOME"] = tempfile.mkdtemp(prefix="polar-test-home-")
    atexit.register(shutil.rmtree, os.environ["POLAR_HOME"], True)

os.environ["POLAR_API_TOKEN"] = TOKEN

os.environ["POLAR_GATEWAY_TOKEN"] = TOKEN

FULL = os.environ.get("POLAR_FULL") == "1"



def stop(proc: subprocess.Popen, grace: float = 4.0) -> None:
    """SIGTERM, then SIGKILL after `grace` s. A gateway or API asked to stop waits (gunicorn's
    graceful shutdown, up to 30 s) for its idle keep-alive connections from the tests' clients; at
    a fixture's teardown nobody needs that wait (it cost ~10 s each in five suites)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()



@dataclass
class Server:
    url: str
    proc: subprocess.Popen
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""



def spawn(args: list[str], ready_url: str, log_dir: Path, name: str,
          env: dict[str, str] | None = None, timeout: float = 90.0) -> Server:
    log = log_dir / f"{name}.log"
    fh = open(log, "wb")
    proc = subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT,
                            env={**os.environ, **(env or {})}, start_new_session=True)
    try:
        wait_http(ready_url, proc, timeout)
    except RuntimeError:
        stop(proc)
        raise RuntimeError(f"{name} did not start:\n{log.read_text(errors='replace')[-4000:]}")
    return Server(url=ready_url.rsplit("/", 1)[0] if ready_url.endswith("/health") else ready_url,
                  proc=proc, log=log)



def start_model_server(log_dir: Path, *extra: str, name: str = "model-server") -> Server:
    port = free_port()
    return spawn([sys.executable, "-m", "polar_mq.dev.model_server", "--host", "127.0.0.1",
                  "--port", str(port), *extra],
                 f"http://127.0.0.1:{port}/health", log_dir, f"{name}-{port}")



@dataclass
class GatewayHandle:
    url: str
    upstream_url: str
    redis_url: str
    server: Server | None = None
    sessions: list[str] = field(default_factory=list)

    admin_headers: dict[str, str] = field(default_factory=lambda: dict(AUTH))

    def new_session(self, **body: Any) -> dict[str, Any]:
        resp = requests.post(f"{self.url}/sessions", json=body, headers=self.admin_headers, timeout=10)
        assert resp.status_code in (200, 201), resp.text
        data = resp.json()
        self.sessions.append(data["session_id"])
        return data

    def calls(self, session_id: str) -> list[dict[str, Any]]:
        resp = requests.get(f"{self.url}/sessions/{session_id}/calls", headers=self.admin_headers, timeout=10)
        assert resp.status_code == 200, resp.text
        return resp.json()["calls"]

    def inflight(self, session_id: str) -> int:
        """The session's calls in flight at the gateway (admitted, not yet recorded)."""
        resp = requests.get(f"{self.url}/sessions/{session_id}", headers=self.admin_headers, timeout=10)
        assert resp.status_code == 200, resp.text
        return int(resp.json().get("inflight_calls") or 0)

    def trajectory(self, session_id: str, builder: str = "per_request") -> dict[str, Any]:
        resp = requests.get(f"{self.url}/sessions/{session_id}/trajectory", params={"builder": builder},
                            headers=self.admin_headers, timeout=30)
        assert resp.status_code == 200, resp.text
        return resp.json()

    def upstream_chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """The same request straight to the upstream, for comparing token ids."""
        resp = requests.post(f"{self.upstream_url}/v1/chat/completions",
                             json={"model": "stand-in", **body, "return_token_ids": True,
                                   "logprobs": True, "stream": False}, timeout=30)
        assert resp.status_code == 200, resp.text
        return resp.json()



def start_gateway(log_dir: Path, redis_url: str, upstreams: list[str], *extra: str,
                  name: str = "gateway", env: dict[str, str] | None = None) -> Server:
    port = free_port()
    args = [sys.executable, "-m", "polar_mq.cli", "gateway", "--host", "127.0.0.1",
            "--port", str(port), "--redis", redis_url, "--workers", "1", *extra]
    for up in upstreams:
        args += ["--upstream", up]
    env = {"POLAR_SPOOL_DIR": str(log_dir / f"spool-{port}"), **(env or {})}
    return spawn(args, f"http://127.0.0.1:{port}/health", log_dir, f"{name}-{port}", env=env)
