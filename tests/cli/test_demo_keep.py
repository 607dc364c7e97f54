"""`polar-mq demo --keep --harness NAME`: the real CLI runs through the demo's own deployment (no
runtime named: the default sandbox; the stand-in as `up` starts it), the session's calls and
prefix-merged traces are shown, and everything keeps serving afterwards: the printed viewer link
signs a browser in, the stand-in serves its default window, and SIGINT (Ctrl-C) ends every
process the demo started.

The default run takes Claude Code (the CLI whose first request is the largest, ~29k tokens: the
one the old 8192 window refused); the other five are marked ``full`` (POLAR_FULL=1)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from tests.support.servers import ROOT
from polar_mq.harnesses import install
from polar_mq.dev.model_server import DEFAULT_MAX_MODEL_LEN

HARNESSES = ["claude_code", "codex", "gemini_cli", "qwen_code", "opencode", "pi"]
DEFAULT = {"claude_code"}


def descendants(pid: int) -> set[int]:
    """Every process below `pid` (from /proc's parent links)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.timeout(900)  # the first run may install the CLI from npm
@pytest.mark.parametrize("harness", [h if h in DEFAULT else pytest.param(h, marks=pytest.mark.full)
                                     for h in HARNESSES])
def test_demo_keep_with_a_real_harness(harness, tmp_path):
    if not install.npm_available():
        pytest.skip("node/npm not on PATH: the harness demo needs them (.ci/run installs them)")
    install.install([harness], timeout=900)  # before the demo's clock starts
    env = {**os.environ, "POLAR_REDIS_URL": "", "POLAR_LOG_DIR": str(tmp_path / "logs"),
           "POLAR_SESSIONS_DIR": str(tmp_path / "sessions"), "POLAR_RESULTS_DIR": str(tmp_path / "results")}
    proc = subprocess.Popen([sys.executable, "-m", "polar_mq.cli", "demo", "--keep", "--harness", harness],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            text=True, env=env, cwd=ROOT)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        deadline = time.time() + 420
        while not any(line.startswith("viewer: ") for line in lines) and time.time() < deadline:
            assert proc.poll() is None, "".join(lines)[-4000:]
            time.sleep(0.5)
        out = "".join(lines)
        assert "viewer: " in out, out[-4000:]
        link = re.search(r"^viewer: (\S+)", out, re.M).group(1)  # type: ignore[union-attr]
        assert "/ui/?token=" in link
        assert re.search(rf"^{harness}: session \S+ COMPLETED; (\d+) calls, (\d+) traces$", out, re.M), out[-4000:]
        assert f"{harness}: the session's model calls" in out and "prefix-merged traces" in out

        browser = requests.Session()
        page = browser.get(link, timeout=30)
        assert page.status_code == 200 and page.url.endswith("/ui/") and "token=" not in page.url
        assert "polar_mq_ui" in browser.cookies
        session_link = re.search(rf"^{harness}: viewer (\S+)", out, re.M).group(1)  # type: ignore[union-attr]
        assert requests.Session().get(session_link, timeout=30).status_code == 200
        upstream = re.search(r"upstream (\S+)", out).group(1)  # type: ignore[union-attr]
        served = requests.get(f"{upstream}/v1/models", timeout=10).json()["data"][0]["max_model_len"]
        assert served == DEFAULT_MAX_MODEL_LEN

        started = descendants(proc.pid)
        assert len(started) >= 6, started  # redis, stand-in, gateway, API, three pools
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=10)
    assert proc.returncode in (0, 130), "".join(lines)[-3000:]
    deadline = time.time() + 20
    while any(alive(p) for p in started) and time.time() < deadline:
        time.sleep(0.2)
    assert not [p for p in started if alive(p)]
    with pytest.raises(requests.ConnectionError):
        requests.get(link, timeout=5)
