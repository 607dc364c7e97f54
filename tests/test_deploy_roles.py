"""The per-role compose files (compose/hub.yml, compose/worker.yml) validate, name every role,
and refuse to start a worker host without its node name or the hub's address."""

from __future__ import annotations

import os
import subprocess

from test_deploy import ROOT, compose_binary


def config(name: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_")}
    return subprocess.run([compose_binary(), "-f", str(ROOT / "compose" / name), "config", *args],
                          capture_output=True, text=True, timeout=60, env={**clean, **env})


def test_role_files_validate_and_name_their_roles():
    hub = config("hub.yml", "--services", POLAR_HUB_ADDR="10.0.0.1")
    assert hub.returncode == 0, hub.stderr
    assert set(hub.stdout.split()) == {"redis", "api", "gateway", "model-server"}
    worker = config("worker.yml", "--services", POLAR_HUB_ADDR="10.0.0.1", POLAR_NODE="w1")
    assert worker.returncode == 0, worker.stderr
    assert set(worker.stdout.split()) == {"worker_init", "worker_run", "worker_postrun"}
    rendered = config("worker.yml", POLAR_HUB_ADDR="10.0.0.1", POLAR_NODE="w1").stdout
    assert "POLAR_NODE: w1" in rendered and "redis://10.0.0.1:6379/0" in rendered
    assert "http://10.0.0.1:8600" in config("hub.yml", POLAR_HUB_ADDR="10.0.0.1").stdout


def test_worker_host_needs_its_node_name_and_the_hub():
    assert config("worker.yml", "--quiet", POLAR_HUB_ADDR="10.0.0.1").returncode != 0
    assert config("worker.yml", "--quiet", POLAR_NODE="w1").returncode != 0
