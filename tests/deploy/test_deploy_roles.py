"""The per-role compose files (compose/hub.yml, compose/worker.yml) validate, name every role,
and refuse to start a worker host without its node name or the hub's address, or any host
without the shared secrets (Redis password, admin token; callback secret on workers)."""

from __future__ import annotations

import os
import subprocess

from tests.deploy.test_deploy import ROOT, compose_binary


SECRETS = {"POLAR_REDIS_PASSWORD": "redis-pw", "POLAR_API_TOKEN": "admin-token", "POLAR_CALLBACK_SECRET": "cb"}


def config(name: str, *args: str, secrets: bool = True, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_")}
    return subprocess.run([compose_binary(), "-f", str(ROOT / "compose" / name), "config", *args],
                          capture_output=True, text=True, timeout=60,
                          env={**clean, **(SECRETS if secrets else {}), **env})


def test_role_files_validate_and_name_their_roles():
    hub = config("hub.yml", "--services", POLAR_HUB_ADDR="10.0.0.1")
    assert hub.returncode == 0, hub.stderr
    assert set(hub.stdout.split()) == {"redis", "api", "gateway", "model-server"}
    worker = config("worker.yml", "--services", POLAR_HUB_ADDR="10.0.0.1", POLAR_NODE="w1")
    assert worker.returncode == 0, worker.stderr
    assert set(worker.stdout.split()) == {"worker_init", "worker_run", "worker_postrun"}
    rendered = config("worker.yml", POLAR_HUB_ADDR="10.0.0.1", POLAR_NODE="w1").stdout
    assert "POLAR_NODE: w1" in rendered and "redis://:redis-pw@10.0.0.1:6379/0" in rendered
    assert "http://10.0.0.1:8600" in config("hub.yml", POLAR_HUB_ADDR="10.0.0.1").stdout


def test_worker_host_needs_its_node_name_and_the_hub():
    assert config("worker.yml", "--quiet", POLAR_HUB_ADDR="10.0.0.1").returncode != 0
    assert config("worker.yml", "--quiet", POLAR_NODE="w1").returncode != 0


def test_every_host_needs_the_shared_secrets():
    for name, env in (("hub.yml", {"POLAR_HUB_ADDR": "10.0.0.1"}),
                      ("worker.yml", {"POLAR_HUB_ADDR": "10.0.0.1", "POLAR_NODE": "w1"})):
        assert config(name, "--quiet", secrets=False, **env).returncode != 0
        for missing in ("POLAR_REDIS_PASSWORD", "POLAR_API_TOKEN"):
            partial = {k: v for k, v in SECRETS.items() if k != missing}
            got = config(name, "--quiet", secrets=False, **partial, **env)
            assert got.returncode != 0 and missing in got.stderr, (name, missing, got.stderr)
    hub = config("hub.yml", POLAR_HUB_ADDR="10.0.0.1").stdout
    assert "redis://:redis-pw@redis:6379/0" in hub and "requirepass" in hub
