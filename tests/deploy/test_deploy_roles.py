"""The per-role compose files (compose/hub.yml, compose/worker.yml) validate, name every role,
and refuse to start a worker host without its node name or the hub's address, or any host
without the shared secrets (Redis password, admin token; callback secret on workers)."""

from __future__ import annotations

import os
import subprocess

from tests.deploy.test_deploy import ROOT, compose_binary


SECRETS = {"POLAR_REDIS_HUB_PASSWORD": "hub-pw", "POLAR_REDIS_GATEWAY_PASSWORD": "gw-pw",
           "POLAR_REDIS_WORKER_PASSWORD": "worker-pw", "POLAR_REDIS_ACL_FILE": "/etc/polar-mq/redis/users.acl",
           "POLAR_API_TOKEN": "admin-token", "POLAR_CALLBACK_SECRET": "cb"}


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
    assert "POLAR_NODE: w1" in rendered and "redis://worker:worker-pw@10.0.0.1:6379/0" in rendered
    assert "http://10.0.0.1:8600" in config("hub.yml", POLAR_HUB_ADDR="10.0.0.1").stdout


def test_worker_host_needs_its_node_name_and_the_hub():
    assert config("worker.yml", "--quiet", POLAR_HUB_ADDR="10.0.0.1").returncode != 0
    assert config("worker.yml", "--quiet", POLAR_NODE="w1").returncode != 0


def test_every_host_needs_the_shared_secrets():
    for name, env in (("hub.yml", {"POLAR_HUB_ADDR": "10.0.0.1"}),
                      ("worker.yml", {"POLAR_HUB_ADDR": "10.0.0.1", "POLAR_NODE": "w1"})):
        assert config(name, "--quiet", secrets=False, **env).returncode != 0
        redis_secret = "POLAR_REDIS_HUB_PASSWORD" if name == "hub.yml" else "POLAR_REDIS_WORKER_PASSWORD"
        for missing in (redis_secret, "POLAR_API_TOKEN"):
            partial = {k: v for k, v in SECRETS.items() if k != missing}
            got = config(name, "--quiet", secrets=False, **partial, **env)
            assert got.returncode != 0 and missing in got.stderr, (name, missing, got.stderr)
    hub = config("hub.yml", POLAR_HUB_ADDR="10.0.0.1").stdout
    assert "redis://hub:hub-pw@redis:6379/0" in hub and "redis://gateway:gw-pw@redis:6379/0" in hub
    assert "--aclfile" in hub and "/etc/polar-mq/redis/users.acl" in hub and "requirepass" not in hub


def test_hub_runs_on_what_polar_mq_redis_acl_writes(tmp_path):
    """One secret source: `polar-mq redis-acl`'s redis.env is all hub.yml needs for Redis (users.acl
    mounted into redis, the hub and gateway users' URLs); worker.yml takes its worker password."""
    import sys

    from polar_mq.store.redis_acl import read_env_file

    out = tmp_path / "redis"
    subprocess.run([sys.executable, "-m", "polar_mq.cli", "redis-acl", "--out", str(out), "--host", "10.0.0.1"],
                   check=True, cwd=ROOT, capture_output=True, timeout=60)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_")}
    got = subprocess.run([compose_binary(), "--env-file", str(out / "redis.env"), "-f", str(ROOT / "compose" / "hub.yml"),
                          "config"], capture_output=True, text=True, timeout=60,
                         env={**clean, "POLAR_HUB_ADDR": "10.0.0.1", "POLAR_API_TOKEN": "t"})
    assert got.returncode == 0, got.stderr
    env = read_env_file(out / "redis.env")
    assert f"redis://gateway:{env['POLAR_REDIS_GATEWAY_PASSWORD']}@redis:6379/0" in got.stdout
    assert str(out / "users.acl") in got.stdout
    worker = config("worker.yml", POLAR_HUB_ADDR="10.0.0.1", POLAR_NODE="w1",
                    POLAR_REDIS_WORKER_PASSWORD=env["POLAR_REDIS_WORKER_PASSWORD"])
    assert f"redis://worker:{env['POLAR_REDIS_WORKER_PASSWORD']}@10.0.0.1:6379/0" in worker.stdout


def test_one_host_overlays_give_every_role_its_acl_user(tmp_path):
    """compose/acl.yml on docker-compose.yml, and sentinel-acl.yml on sentinel.yml + acl.yml: every
    role's URL names its own user (Sentinel URLs too); data nodes load users.acl and replicate as
    `replica`, Sentinels watch as `sentinel`; both refuse to render without redis-acl's env file."""
    import json
    import sys

    from polar_mq.store.redis_acl import read_env_file
    from polar_mq.store.redis_url import parse_sentinel

    out = tmp_path / "redis"
    subprocess.run([sys.executable, "-m", "polar_mq.cli", "redis-acl", "--out", str(out), "--sentinel"],
                   check=True, cwd=ROOT, capture_output=True, timeout=60)
    env = read_env_file(out / "redis.env")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_")}
    clean["POLAR_TOKEN_FILE"] = str(ROOT / "README.md")
    users = {"api": "hub", "flower": "hub", "gateway": "gateway", "worker_init": "worker", "worker_run": "worker",
             "worker_postrun": "worker"}
    for files in (["docker-compose.yml", "acl.yml"], ["docker-compose.yml", "sentinel.yml", "acl.yml", "sentinel-acl.yml"]):
        args = [compose_binary(), *[a for f in files for a in ("-f", str(ROOT / "compose" / f))], "config", "--format", "json"]
        assert subprocess.run(args, capture_output=True, text=True, timeout=60, env=clean).returncode != 0
        got = subprocess.run([args[0], "--env-file", str(out / "redis.env"), *args[1:]], capture_output=True,
                             text=True, timeout=60, env=clean)
        assert got.returncode == 0, got.stderr
        services = json.loads(got.stdout)["services"]
        for name, user in users.items():
            url = services[name]["environment"]["POLAR_REDIS_URL"]
            password = env[f"POLAR_REDIS_{user.upper()}_PASSWORD"]
            if "sentinel.yml" in files:
                p = parse_sentinel(url)
                assert (p.username, p.password, p.master, len(p.sentinels)) == (user, password, "polar", 3), url
            else:
                assert url == f"redis://{user}:{password}@redis:6379/0", (name, url)
        assert any(v["target"] == "/etc/redis/users.acl" for v in services["redis"]["volumes"])
        if "sentinel.yml" in files:
            for name in ("redis", "redis-replica-1", "redis-replica-2"):
                assert "masteruser replica" in " ".join(services[name]["command"]), name
            assert "sentinel auth-user polar sentinel" in " ".join(services["sentinel-1"]["command"])
