"""The Procfile on non-default ports: every role derives what it needs from the same variables
(the pools' gateway URL from POLAR_HOST/GATEWAY_PORT), so a task completes under real honcho."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.servers import ROOT, wait_http
from tests.support.pipeline import TINY_AGENT
from polar_mq.client import Client
from polar_mq.cli.embedded_redis import free_port


@pytest.mark.timeout(240)
def test_honcho_start_on_other_ports_completes_a_task(tmp_path, redis_url, model_server):
    api_port, gw_port = free_port(), free_port()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "API_PORT": str(api_port), "GATEWAY_PORT": str(gw_port), "POLAR_HOST": "127.0.0.1",
           "POLAR_REDIS_URL": redis_url, "POLAR_UPSTREAMS": model_server,
           "POLAR_INIT_CONCURRENCY": "1", "POLAR_RUN_CONCURRENCY": "1", "POLAR_POSTRUN_CONCURRENCY": "1",
           "POLAR_SESSIONS_DIR": str(tmp_path / "sessions"), "POLAR_RESULTS_DIR": str(tmp_path / "results"),
           "POLAR_TASK_EVENTS": "0", "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("POLAR_GATEWAY_URL", None)
    log = open(tmp_path / "honcho.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "honcho", "-f", str(ROOT / "Procfile"), "start",
                             "api", "gateway", "worker_init", "worker_run", "worker_postrun"],
                            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{gw_port}/health", proc, timeout=120)
        wait_http(f"http://127.0.0.1:{api_port}/health", proc, timeout=120)
        client = Client(f"http://127.0.0.1:{api_port}")
        sub = client.submit({"instruction": "Write hello into polar.txt", "num_samples": 1, "timeout_seconds": 60,
                             "agent": {"harness": "shell", "options": {"command": [sys.executable, str(TINY_AGENT)]}}})
        status = client.wait(sub["task_id"], timeout=120)
        out = (tmp_path / "honcho.log").read_text(errors="replace")[-3000:]
        assert [s["state"] for s in status["sessions"]] == ["COMPLETED"], (status["sessions"], out)
        assert client.results(sub["task_id"])["trajectories"][0]["stats"]["calls"] >= 2
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
