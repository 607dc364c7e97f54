"""A newcomer's first commands work as written (issue 39).

- `polar-mq model-server` and `polar-mq harness` hand every argument (options and `--help`
  included) to their module's own parser.
- The stand-in's default window fits the first request of every shipped agent CLI (recorded in
  tests/replays) plus the output cap the harness shortcuts derive from that window.
- `polar-mq up` refuses ports that are taken, before starting anything or printing "is up".
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from tests.support.servers import ROOT, stop
from polar_mq.harnesses.limits import resolve
from polar_mq.dev.model_server import DEFAULT_MAX_MODEL_LEN

POLAR_MQ = [sys.executable, "-m", "polar_mq.cli"]
HARNESSES = ["claude_code", "codex", "gemini_cli", "qwen_code", "opencode", "pi"]


def run_cli(*args: str, timeout: float = 60, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*POLAR_MQ, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("command, expect", [("model-server", "--max-model-len"), ("harness", "install")])
def test_pass_through_help(command, expect):
    r = run_cli(command, "--help")
    assert r.returncode == 0, r.stderr
    assert f"usage: polar-mq {command}" in r.stdout and expect in r.stdout


def test_model_server_takes_its_options():
    proc = subprocess.Popen([*POLAR_MQ, "model-server", "--port", "0", "--max-model-len", "12345",
                             "--served-model-name", "first-hour"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=ROOT, start_new_session=True)
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert "ready on http://" in line, line + (proc.stdout.read() if proc.poll() is not None else "")
        url = line.split("ready on ")[1].split()[0]
        model = requests.get(f"{url}/v1/models", timeout=10).json()["data"][0]
        assert model["id"] == "first-hour" and model["max_model_len"] == 12345
    finally:
        stop(proc)


def test_model_server_rejects_unknown_option():
    r = run_cli("model-server", "--no-such-flag")
    assert r.returncode == 2 and "unrecognized arguments: --no-such-flag" in r.stderr


@pytest.mark.parametrize("harness", HARNESSES)
def test_stand_in_window_fits_every_cli(harness):
    """Each recorded model request of the CLI, counted with the stand-in's own tokenizer as the
    JSON body it sent (more tokens than the rendered prompt: the JSON syntax counts too), plus the
    output cap the shortcut asks for, fits the default window."""
    from polar_mq.dev.model_server.tokenizer import load_tokenizer

    tok = load_tokenizer()
    biggest = 0
    for f in (ROOT / "tests" / "replays" / harness).glob("*.json"):
        for req in json.loads(f.read_text())["requests"]:
            if req.get("generation") and req.get("body"):
                biggest = max(biggest, len(tok.encode(json.dumps(req["body"]))))
    assert biggest > 1000, "no recorded model request"
    limits = resolve(DEFAULT_MAX_MODEL_LEN)
    assert biggest + limits.max_output <= DEFAULT_MAX_MODEL_LEN, (biggest, limits)


def _listening_socket() -> tuple[socket.socket, int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    return s, s.getsockname()[1]


def test_up_refuses_a_taken_port_before_starting_anything(tmp_path):
    held, port = _listening_socket()
    try:
        r = run_cli("up", "--api-port", str(port), "--no-flower", timeout=60,
                    env={"POLAR_LOG_DIR": str(tmp_path / "logs")})
    finally:
        held.close()
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "is up" not in r.stdout + r.stderr
    assert f"port {port} (api) on 127.0.0.1 is taken by pid {os.getpid()}" in r.stderr, r.stderr
    assert not (tmp_path / "logs").exists()  # nothing started (the log dir is made by the first start)


def test_taken_port_holder_from_proc():
    from polar_mq.cli import preflight

    held, port = _listening_socket()
    with held:
        assert preflight.is_taken("127.0.0.1", port)
        assert (preflight.holder(port) or "").startswith(f"pid {os.getpid()} (")
    assert not preflight.is_taken("127.0.0.1", port)


def test_demo_harness_choices_are_the_pinned_clis():
    from polar_mq.cli.commands import DEMO_HARNESSES
    from polar_mq.harnesses.install import HARNESS_NAMES

    assert sorted(DEMO_HARNESSES) == sorted(HARNESS_NAMES) == sorted(HARNESSES)
