"""Tokens and trust (CONTRACT "Tokens and trust"): services started with no token generate one into
$POLAR_HOME/token (0600) and never serve open; the CLI and the client read it; the gateway's
/sessions resources need the admin token and a session key opens only its own session."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest
import requests

from tests.support.servers import ROOT, spawn, stop
from polar_mq.client import ApiError, Client
from polar_mq.cli.embedded_redis import free_port

NO_TOKENS = {"POLAR_API_TOKEN": "", "POLAR_GATEWAY_TOKEN": ""}


@pytest.fixture()
def fresh_home(tmp_path, monkeypatch):
    """A POLAR_HOME without a token file and no token in the environment (this process too)."""
    home = tmp_path / "home"
    for k, v in {**NO_TOKENS, "POLAR_HOME": str(home)}.items():
        monkeypatch.setenv(k, v)
    return home


def start_gateway(tmp_path, redis_url, model_server, *extra, env=None):
    port = free_port()
    args = [sys.executable, "-m", "polar_mq.cli", "gateway", "--host", "127.0.0.1", "--port", str(port),
            "--redis", redis_url, "--upstream", model_server, "--workers", "1", *extra]
    return spawn(args, f"http://127.0.0.1:{port}/health", tmp_path, f"gw-{port}",
                 env={"POLAR_SPOOL_DIR": str(tmp_path / "spool"), **(env or {})})


def test_gateway_generates_a_token_and_guards_sessions(fresh_home, tmp_path, redis_url, model_server):
    server = start_gateway(tmp_path, redis_url, model_server)
    try:
        token_file = fresh_home / "token"
        assert token_file.exists() and stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = token_file.read_text().strip()
        assert len(token) >= 40
        admin = {"Authorization": f"Bearer {token}"}
        url = server.url
        # No token, a wrong one, a Basic one: 401 problem details, no session created.
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": f"Basic {token}"}):
            resp = requests.post(f"{url}/sessions", json={}, headers=headers, timeout=5)
            assert resp.status_code == 401 and resp.headers["Content-Type"].startswith("application/problem+json")
            assert token not in resp.text
        a = requests.post(f"{url}/sessions", json={"session_id": "trust-a"}, headers=admin, timeout=5).json()
        b = requests.post(f"{url}/sessions", json={"session_id": "trust-b"}, headers=admin, timeout=5).json()
        # A session key is never an admin token: not for its own records, not for another's.
        for key in (a["key"], b["key"]):
            for path in ("/sessions/trust-a/calls", "/sessions/trust-b", "/sessions/trust-a/trajectory"):
                for headers in ({"Authorization": f"Bearer {key}"}, {"x-api-key": key}):
                    assert requests.get(f"{url}{path}", headers=headers, timeout=5).status_code == 401
            # ... and creating an existing session with it never hands back that session's key.
            again = requests.post(f"{url}/sessions", json={"session_id": "trust-a"},
                                  headers={"Authorization": f"Bearer {key}"}, timeout=5)
            assert again.status_code == 401 and a["key"] not in again.text
        again = requests.post(f"{url}/sessions", json={"session_id": "trust-a"}, headers=admin, timeout=5)
        assert again.status_code == 200 and again.json()["key"] == a["key"]
        # A key opens its own session's provider endpoints and records there only.
        body = {"model": "m", "messages": [{"role": "user", "content": "hi polar:notool"}]}
        ok = requests.post(f"{a['base_urls']['openai']}/chat/completions", json=body, timeout=30)
        assert ok.status_code == 200
        calls_a = requests.get(f"{url}/sessions/trust-a/calls", headers=admin, timeout=5).json()["calls"]
        calls_b = requests.get(f"{url}/sessions/trust-b/calls", headers=admin, timeout=5).json()["calls"]
        assert len(calls_a) == 1 and calls_b == []
        # The CLI's token command and the client read the same file.
        out = subprocess.run([sys.executable, "-m", "polar_mq.cli", "token"], capture_output=True, text=True,
                             cwd=ROOT, env=os.environ.copy(), timeout=30)
        assert out.stdout.strip() == token
        assert Client(url="http://127.0.0.1:1").token == token
    finally:
        stop(server.proc)
    assert a["key"] not in server.output() and b["key"] not in server.output()


def test_dev_gateway_is_open_loudly_and_never_returns_an_existing_key(fresh_home, tmp_path, redis_url,
                                                                      model_server):
    server = start_gateway(tmp_path, redis_url, model_server, "--dev")
    try:
        first = requests.post(f"{server.url}/sessions", json={"session_id": "dev-a"}, timeout=5)
        assert first.status_code == 201
        again = requests.post(f"{server.url}/sessions", json={"session_id": "dev-a"}, timeout=5)
        assert again.status_code == 409 and first.json()["key"] not in again.text
    finally:
        stop(server.proc)
    assert "NO AUTHENTICATION" in server.output()
    assert not (fresh_home / "token").exists()  # --dev writes no token


def test_api_generates_a_token_admin_pause_needs_it(fresh_home, tmp_path, redis_url):
    port = free_port()
    db = redis_url.rsplit("/", 1)[0] + "/13"
    server = spawn([sys.executable, "-m", "polar_mq.cli", "api", "--host", "127.0.0.1", "--port", str(port),
                    "--redis", db, "--workers", "1"], f"http://127.0.0.1:{port}/health", tmp_path, "api")
    try:
        token = (fresh_home / "token").read_text().strip()
        url = server.url
        for method, path in (("POST", "/v1/admin/pause"), ("POST", "/v1/admin/resume"), ("GET", "/v1/tasks"),
                             ("GET", "/metrics"), ("POST", "/v1/tasks")):
            resp = requests.request(method, f"{url}{path}", json={}, timeout=10)
            assert resp.status_code == 401, (path, resp.text)
        assert requests.get(f"{url}/openapi.json", timeout=10).status_code == 200  # the document is public
        c = Client(url)  # no token given: read from $POLAR_HOME/token
        assert c.token == token and isinstance(c.tasks(), list)
        with pytest.raises(ApiError) as info:
            Client(url, token="wrong").tasks()
        assert info.value.status == 401
    finally:
        stop(server.proc)
