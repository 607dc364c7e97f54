"""`polar-mq deploy slurm` on a real single-node Slurm (slurmctld + slurmd on this machine, munge
for auth; scripts/slurm_single_node.sh sets it up, .ci/run installs slurm-wlm and munge).

The end-to-end case deploys examples/slurm/single-node.yaml (ports moved to free ones) as Slurm
jobs, runs a task of 8 sessions through them against the stand-in model server, checks that
`status` lists the jobs and reports one killed by scancel, and that `stop` ends exactly the
deployment's jobs while a job it did not start keeps running."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.support.servers import ROOT
from polar_mq.deploy.slurm_config import ConfigError, parse
from polar_mq.cli.embedded_redis import free_port

EXAMPLE = ROOT / "examples" / "slurm" / "single-node.yaml"


@pytest.fixture(scope="module")
def slurm():
    """A running single-node Slurm; a missing install is a failure, not a skip (only a machine
    where this test cannot be root skips: slurmctld, slurmd and munged need it)."""
    if os.geteuid() != 0:
        pytest.skip("a real single-node Slurm needs root (slurmctld, slurmd, munged)")
    script = str(ROOT / "scripts" / "slurm_single_node.sh")
    was_up = shutil.which("sinfo") is not None and subprocess.run(
        ["sinfo", "-h"], capture_output=True, timeout=30).returncode == 0
    out = subprocess.run([script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"single-node Slurm did not come up:\n{out.stdout}\n{out.stderr}"
    yield
    if not was_up:  # leave the machine as it was: a Slurm this test started stops with it
        subprocess.run([script, "stop"], capture_output=True, timeout=60)


def cli(*args: str, env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "polar_mq.cli", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=ROOT)


def squeue_state(job_id: str) -> str:
    out = subprocess.run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"], capture_output=True, text=True)
    return out.stdout.strip() or "GONE"


def status_lines(env: dict[str, str], config: Path) -> tuple[dict[str, str], dict[str, tuple[str, str]]]:
    """(`{"api": URL, "gateway": URL}`, `{job_id: (role, state)}`) from `deploy slurm status`."""
    out = cli("deploy", "slurm", "status", "--config", str(config), env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    urls, jobs = {}, {}
    for line in out.stdout.splitlines():
        parts = line.split()
        if parts[0] in ("api", "gateway"):
            urls.setdefault(parts[0], parts[1])
        else:
            assert len(parts) == 3 and parts[0].isdigit(), line
            jobs[parts[0]] = (parts[1], parts[2])
    return urls, jobs


def deploy_env(home: Path) -> dict[str, str]:
    """The deploying user's environment: no token variables, a fresh $POLAR_HOME, so the token
    comes from where `polar-mq token` finds it (the file) for the jobs and the client alike."""
    env = {k: v for k, v in os.environ.items() if k not in ("POLAR_API_TOKEN", "POLAR_GATEWAY_TOKEN",
                                                            "POLAR_REDIS_URL", "POLAR_API_URL")}
    env["POLAR_HOME"] = str(home)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    return env


def test_config_errors_name_the_key():
    good = yaml.safe_load(EXAMPLE.read_text())
    dep = parse(good)
    assert dep.sandbox == "bwrap" and dep.standin and set(dep.roles) == {"hub", "standin", "gateway", "init",
                                                                          "run", "postrun"}
    assert parse({"upstreams": ["http://gpu1:8000"]}).sandbox == "apptainer"  # the cluster default
    assert parse({"upstream_jobs": [{"job": 42, "port": 8000}]}).upstream_jobs == [{"job": "42", "port": 8000}]
    for bad, key in ((dict(good, sandbox="kvm"), "sandbox"), (dict(good, roles={"hub": {"cpus": 0}}), "roles.hub.cpus"),
                     (dict(good, roles={"web": {}}), "roles.web"), (dict(good, standin=False), "upstreams"),
                     (dict(good, redis="mysql://x"), "redis"), (dict(good, name="a b"), "name"),
                     (dict(good, upstream_jobs=[{"job": "x1"}]), "upstream_jobs"),
                     (dict(good, upstreams=["http://gpu1:8000"]), "upstreams")):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            parse(bad)


def test_host_lists_expand_as_slurm_expands_them(slurm):
    from polar_mq.deploy.slurm_config import expand_hostlist

    for nodelist in ("gpu-[001-003,7],head", "a[1-2]b[3-4]", "vm", "n[08-10]"):
        ours = expand_hostlist(nodelist)
        theirs = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                                check=True).stdout.split()
        assert ours == theirs, nodelist


def test_cluster_example_places_a_gateway_and_a_run_pool_on_each_run_node(tmp_path):
    out = cli("deploy", "slurm", "--config", str(ROOT / "examples" / "slurm" / "cluster.yaml"), "--dry-run",
              env=deploy_env(tmp_path / "home"), timeout=60)
    assert out.returncode == 0, out.stderr
    scripts = out.stdout.split("# ---- ")[1:]
    pinned = {s.split(":")[0]: [ln for ln in s.splitlines() if ln.startswith("#SBATCH --nodelist=")] for s in scripts}
    assert pinned["gateway-0"] == pinned["run-0"] == ["#SBATCH --nodelist=gpu-001"]
    assert pinned["gateway-1"] == pinned["run-1"] == ["#SBATCH --nodelist=gpu-002"]
    assert "--dependency=after:<hub job ids>:81234:81235" in out.stdout  # gateways start once vLLM's jobs do
    assert "backend: apptainer" in out.stdout


def test_dry_run_prints_scripts_and_submits_nothing(tmp_path, slurm):
    env = deploy_env(tmp_path / "home")
    before = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.split()
    out = cli("deploy", "slurm", "--config", str(EXAMPLE), "--dry-run", env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    for role in ("hub", "standin", "gateway", "init", "run", "postrun"):
        assert f"#SBATCH --job-name=pmq-single-node-{role}" in out.stdout
        assert f"polar_mq.deploy.slurm_role {role} " in out.stdout
    assert "--dependency=after:" in out.stdout and "backend: bwrap" in out.stdout
    assert not (tmp_path / "home" / "slurm" / "single-node" / "deployment.json").exists()
    assert subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.split() == before
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nroles: {hub: {cpus: many}}\nstandin: true\n")
    out = cli("deploy", "slurm", "--config", str(bad), "--dry-run", env=env, timeout=60)
    assert out.returncode == 2 and "roles.hub.cpus" in out.stderr and "Traceback" not in out.stderr


def test_role_fails_without_hub(tmp_path, slurm):
    """A hub that cannot reach its Redis, and a gateway that never sees a hub, fail their jobs with
    a line naming what was unreachable; they do not sit idle."""
    env = deploy_env(tmp_path / "home")
    dead = free_port()
    cfg = tmp_path / "dead.yaml"
    cfg.write_text(yaml.safe_dump({
        "name": f"dead{os.getpid()}", "sandbox": "local", "redis": f"redis://:pw@127.0.0.1:{dead}/0",
        "upstreams": [f"http://127.0.0.1:{free_port()}"], "network": {"bind": "127.0.0.1", "advertise": "127.0.0.1"},
        "preflight_timeout": 3, "roles": {"hub": {"api_port": 0}, "gateway": {"port": 0}},
        "defaults": {"cpus": 1}}))
    out = cli("deploy", "slurm", "--config", str(cfg), env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    try:
        deadline, jobs = time.time() + 90, {}
        while time.time() < deadline:
            _, jobs = status_lines(env, cfg)
            if {r: s for r, s in jobs.values()}.get("hub") == "FAILED" and \
                    {r: s for r, s in jobs.values()}.get("gateway") == "FAILED":
                break
            time.sleep(1)
        roles = {role: (jid, state) for jid, (role, state) in jobs.items()}
        assert roles["hub"][1] == "FAILED" and roles["gateway"][1] == "FAILED", jobs
        logs = tmp_path / "home" / "slurm" / f"dead{os.getpid()}" / "logs"
        hub_log = (logs / f"hub-0-{roles['hub'][0]}.out").read_text()
        assert f"cannot reach Redis at redis://***@127.0.0.1:{dead}/0" in hub_log and ":pw@" not in hub_log
        assert "cannot reach the hub" in (logs / f"gateway-0-{roles['gateway'][0]}.out").read_text()
    finally:
        cli("deploy", "slurm", "stop", "--config", str(cfg), env=env, timeout=120)


def test_upstream_job_resolves_to_its_node(tmp_path, slurm):
    """`upstream_jobs`: a gateway finds the vLLM server a Slurm job serves on its node (here a
    stand-in model server started as a job), waiting while it starts; an ended job fails at once."""
    from polar_mq.deploy.slurm_config import parse as parse_config
    from polar_mq.deploy.slurm_role import RoleError, job_url, upstreams

    port = free_port()
    job = subprocess.run(["sbatch", "--parsable", "--job-name=vllm-standin", f"--output={tmp_path}/ms.out",
                          "--wrap", f"exec {sys.executable} -m polar_mq.dev.model_server --host 127.0.0.1 --port {port}"],
                         capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)}
                         ).stdout.strip()
    try:
        dep = parse_config({"upstream_jobs": [{"job": int(job), "port": port}], "preflight_timeout": 60})
        node = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()
        assert upstreams(tmp_path, dep, 60) == [f"http://{node}:{port}"]
    finally:
        subprocess.run(["scancel", job], check=True)
    deadline = time.time() + 30
    while squeue_state(job) not in ("CANCELLED", "GONE") and time.time() < deadline:
        time.sleep(0.5)
    with pytest.raises(RoleError, match=f"vLLM job {job} is CANCELLED"):
        job_url(job, port)


def test_deploy_slurm_end_to_end(tmp_path, slurm):
    home = tmp_path / "home"
    env = deploy_env(home)
    spec = yaml.safe_load(EXAMPLE.read_text())
    spec["name"] = f"e2e{os.getpid()}"
    spec["roles"]["hub"]["api_port"] = free_port()  # leave 8700 and 8600 to whoever else uses them
    spec["roles"]["gateway"]["port"] = free_port()
    config = tmp_path / "single-node.yaml"
    config.write_text(yaml.safe_dump(spec))
    foreign = subprocess.run(["sbatch", "--parsable", "--job-name=not-polar", "--output=/dev/null",
                              "--wrap", "sleep 600"], capture_output=True, text=True, check=True).stdout.strip()
    ids: list[str] = []
    try:
        out = cli("deploy", "slurm", "--config", str(config), "--wait", "150", env=env)
        assert out.returncode == 0, out.stdout + out.stderr
        record = json.loads((home / "slurm" / spec["name"] / "deployment.json").read_text())
        ids = [j["job_id"] for j in record["jobs"]]
        assert [j["role"] for j in record["jobs"]] == ["hub", "standin", "gateway", "init", "run", "postrun"]
        urls, jobs = status_lines(env, config)
        assert set(jobs) == set(ids) and foreign not in jobs
        assert urls["api"] == f"http://127.0.0.1:{spec['roles']['hub']['api_port']}"
        assert urls["gateway"] == f"http://127.0.0.1:{spec['roles']['gateway']['port']}"
        # Every role's pool comes up (the workers' jobs start after the gateway's).
        deadline = time.time() + 60
        while time.time() < deadline and any(state != "RUNNING" for _, state in jobs.values()):
            time.sleep(1)
            urls, jobs = status_lines(env, config)
        assert all(state == "RUNNING" for _, state in jobs.values()), jobs

        # The token is where `polar-mq token` finds it for the deploying user.
        token = cli("token", env=env, timeout=60).stdout.strip()
        assert token and (home / "token").read_text().strip() == token
        from polar_mq.client import Client

        client = Client(url=urls["api"], token=token)
        call = ("import json, os, urllib.request; req = urllib.request.Request("
                "os.environ['OPENAI_BASE_URL'] + '/chat/completions', data=json.dumps({'model': 'policy', "
                "'messages': [{'role': 'user', 'content': os.environ['POLAR_INSTRUCTION']}], 'max_tokens': 8})"
                ".encode(), headers={'Authorization': 'Bearer ' + os.environ['OPENAI_API_KEY'], "
                "'content-type': 'application/json'}); print(urllib.request.urlopen(req, timeout=30).read()[:80])")
        task = client.submit({"instruction": "say hi", "num_samples": 8, "timeout_seconds": 120,
                              "agent": {"harness": "shell", "model": "policy",
                                        "options": {"command": [sys.executable, "-c", call]}},
                              "runtime": {"backend": spec["sandbox"]}})
        done = client.wait(task["task_id"], timeout=150)
        assert done["counts"] == {"COMPLETED": 8}, done
        trajectories = client.results(task["task_id"])["trajectories"]
        assert len(trajectories) == 8 and all(t["stats"]["calls"] == 1 for t in trajectories)

        # A role killed by scancel is reported; the others keep running.
        postrun = next(jid for jid, (role, _) in jobs.items() if role == "postrun")
        subprocess.run(["scancel", postrun], check=True)
        deadline = time.time() + 30
        while time.time() < deadline and status_lines(env, config)[1][postrun][1] in ("RUNNING", "COMPLETING"):
            time.sleep(0.5)
        _, jobs = status_lines(env, config)
        assert jobs[postrun] == ("postrun", "CANCELLED"), jobs
        assert all(state == "RUNNING" for jid, (_, state) in jobs.items() if jid != postrun), jobs
        assert client.status(task["task_id"])["counts"] == {"COMPLETED": 8}  # the hub still answers

        # A service that dies inside its job fails the job (the role runner watches it).
        standin_url = json.loads((home / "slurm" / spec["name"] / "run" / "standin-0.json").read_text())["url"]
        pid = subprocess.run(["pgrep", "-f", f"polar_mq.dev.model_server --host 127.0.0.1 --port "
                              f"{standin_url.rsplit(':', 1)[1]}"], capture_output=True, text=True).stdout.split()
        assert len(pid) == 1, pid
        os.kill(int(pid[0]), 9)
        standin = next(jid for jid, (role, _) in jobs.items() if role == "standin")
        deadline = time.time() + 30
        while time.time() < deadline and status_lines(env, config)[1][standin][1] in ("RUNNING", "COMPLETING"):
            time.sleep(0.5)
        assert status_lines(env, config)[1][standin] == ("standin", "FAILED")
        log = (home / "slurm" / spec["name"] / "logs" / f"standin-0-{standin}.out").read_text()
        assert "FAILED: model-server exited with -9" in log, log[-2000:]

        # `stop` ends exactly the deployment's jobs.
        out = cli("deploy", "slurm", "stop", "--config", str(config), env=env, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        ended = {jid: squeue_state(jid) for jid in ids}
        assert ended == {jid: {standin: "FAILED"}.get(jid, "CANCELLED") for jid in ids}, ended
        assert squeue_state(foreign) == "RUNNING"
    finally:
        if ids:
            subprocess.run(["scancel", *ids], capture_output=True)
        subprocess.run(["scancel", foreign], capture_output=True)
