"""`polar-mq deploy slurm`: the polar_mq roles as Slurm jobs — start, report, stop.

`deploy slurm --config FILE` writes one sbatch script per job into the deployment's state dir
(`$POLAR_HOME/slurm/<name>/`, on a filesystem every node shares), submits them with
`sbatch --parsable` and records each job id with its role in `deployment.json`. The jobs find
each other through that dir: the hub publishes its Redis and API, each stand-in and gateway its
URL (`run/*.json`, mode 0600), and every role waits for what it needs at most
`preflight_timeout` s, then fails its job with a clear message (polar_mq/deploy/slurm_role.py).
`status` asks squeue (then sacct) about exactly the recorded ids; `stop` scancels exactly those
ids, nothing else (tests/deploy/test_slurm.py::test_deploy_slurm_end_to_end guards both).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polar_mq.deploy.slurm_config import ConfigError, Deployment, Role, expand_hostlist, load

STATE_FILE = "deployment.json"
SUBMIT_ORDER = ("hub", "standin", "gateway", "init", "run", "postrun")
# Which roles a role's jobs start after (sbatch --dependency=after:...): each waits for its
# inputs in its preflight anyway; the dependency keeps that wait from running out while the
# inputs are still queued.
AFTER = {"standin": (), "hub": (), "gateway": ("hub", "standin"), "init": ("hub", "gateway"),
         "run": ("hub", "gateway"), "postrun": ("hub", "gateway")}
LIVE_STATES = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING",
               "STAGE_OUT", "SIGNALING", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "STOPPED"}


class DeployError(RuntimeError):
    """Deploying, reporting or stopping failed; the message says why and what to do."""


@dataclass
class Job:
    """One job to submit: a role's `index`-th instance, pinned to `node` when the role names nodes."""

    role: str
    index: int
    node: str | None = None

    @property
    def label(self) -> str:
        return f"{self.role}-{self.index}"


def state_root() -> Path:
    from polar_mq.settings import polar_home

    return polar_home() / "slurm"


def state_dir(name: str) -> Path:
    return state_root() / name


def _tool(name: str) -> str:
    found = shutil.which(name)
    if not found:
        raise DeployError(f"{name} not found: run this on a Slurm login node (or install slurm-wlm)")
    return found


def plan(dep: Deployment) -> list[Job]:
    """Every job of the deployment, in submission order. A role with a `nodelist` gets one job
    per node (a gateway and a run pool on each run node); else `count` jobs."""
    jobs: list[Job] = []
    for name in SUBMIT_ORDER:
        role = dep.roles.get(name)
        if role is None:
            continue
        if name == "hub":
            jobs.append(Job(name, 0, role.nodelist))
        elif role.nodelist:
            jobs += [Job(name, i, node) for i, node in enumerate(expand_hostlist(role.nodelist))]
        else:
            jobs += [Job(name, i) for i in range(role.count)]
    return jobs


def render_script(dep: Deployment, job: Job, state: Path, python: str, env: dict[str, str]) -> str:
    """The sbatch script of one job: placement as #SBATCH lines, then the role runner."""
    role: Role = dep.roles[job.role]
    lines = ["#!/bin/bash", f"#SBATCH --job-name=pmq-{dep.name}-{job.role}",
             f"#SBATCH --output={state}/logs/{job.label}-%j.out", "#SBATCH --nodes=1", "#SBATCH --ntasks=1",
             f"#SBATCH --cpus-per-task={role.cpus}"]
    if job.node:
        lines.append(f"#SBATCH --nodelist={job.node}")
    for key, opt in (("partition", "partition"), ("mem", "mem"), ("time", "time"), ("account", "account"),
                     ("qos", "qos")):
        value = getattr(role, key)
        if value:
            lines.append(f"#SBATCH --{opt}={value}")
    lines += [f"#SBATCH {opt}" for opt in role.sbatch]
    lines += ["",
              f"# polar_mq role {job.role} #{job.index} of deployment {dep.name}, written by `polar-mq deploy slurm`.",
              f"# It waits at most {dep.preflight_timeout:g} s for what it needs (the hub's Redis, its upstream),",
              "# then fails the job with a clear message instead of idling. Logs: the --output file above.",
              "set -euo pipefail"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    lines.append(f"exec {shlex.quote(python)} -m polar_mq.deploy.slurm_role {job.role} "
                 f"--state {shlex.quote(str(state))} --index {job.index}")
    return "\n".join(lines) + "\n"


def task_template(dep: Deployment) -> str:
    """A TaskRequest template for `polar-mq submit --template`: the sandbox these nodes use."""
    backend = dep.sandbox
    image = {"apptainer": "docker://node:20-slim", "docker": "node:20-slim"}.get(backend)
    runtime = f"  backend: {backend}\n" + (f"  image: {image}  # the harness CLIs need node; add your task's tools\n"
                                           if image else "")
    return ("# Written by `polar-mq deploy slurm`: the sandbox backend of this deployment's nodes.\n"
            "# Use: polar-mq submit --dataset rows.jsonl --template THIS_FILE\n"
            "num_samples: 8\ntimeout_seconds: 1800\n"
            "agent:\n  harness: codex\n  model: policy\n"
            f"runtime:\n{runtime}"
            "builder:\n  strategy: prefix_merging\n")


def _role_env(dep: Deployment) -> dict[str, str]:
    """What every job exports: where the token file is (the deploying user's $POLAR_HOME), the
    deploying interpreter's import path, and the config's `env`. No secret is written here."""
    from polar_mq.settings import polar_home

    env = {"POLAR_HOME": str(polar_home())}
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    env.setdefault("POLAR_TASK_EVENTS", "0")  # no Flower in a Slurm deployment: nobody reads them
    env.update(dep.env)
    return env


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(path, 0o600)


def read_state(state: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads((state / STATE_FILE).read_text())
        return data
    except FileNotFoundError:
        raise DeployError(f"no deployment in {state}: deploy it first (`polar-mq deploy slurm --config FILE`)") from None


def job_states(ids: list[str]) -> dict[str, str]:
    """State of each job id: squeue (live jobs and those slurmctld still remembers), then sacct
    (accounting, when the site has it); an id neither knows is GONE."""
    if not ids:
        return {}
    states: dict[str, str] = {}
    out = subprocess.run([_tool("squeue"), "-h", "-t", "all", "-j", ",".join(ids), "-o", "%i|%T"],
                         capture_output=True, text=True, timeout=60)
    for line in out.stdout.splitlines():
        jid, _, state = line.strip().partition("|")
        if jid in ids:
            states[jid] = state
    missing = [i for i in ids if i not in states]
    if missing and shutil.which("sacct"):
        acct = subprocess.run(["sacct", "-n", "-X", "-P", "-j", ",".join(missing), "-o", "JobID,State"],
                              capture_output=True, text=True, timeout=60)
        if acct.returncode == 0:
            for line in acct.stdout.splitlines():
                jid, _, state = line.strip().partition("|")
                if jid in missing and state:
                    states[jid] = state.split()[0]  # "CANCELLED by 0" → CANCELLED
    return {i: states.get(i, "GONE") for i in ids}


def published(state: Path, prefix: str) -> list[dict[str, Any]]:
    """The endpoints roles published under `state/run/` (`hub.json`, `gateway-*.json`, ...)."""
    found = []
    for path in sorted((state / "run").glob(f"{prefix}*.json")):
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return found


def endpoints(state: Path) -> tuple[str | None, list[str]]:
    hub = published(state, "hub")
    api = hub[0].get("api_url") if hub else None
    return api, [g["url"] for g in published(state, "gateway-") if g.get("url")]


def deploy(config: str, *, dry_run: bool = False, wait: float = 0.0, out: Any = sys.stdout) -> int:
    dep = load(config)
    state = state_dir(dep.name)
    python = dep.python or sys.executable
    env = _role_env(dep)
    jobs = plan(dep)
    scripts = {job.label: render_script(dep, job, state, python, env) for job in jobs}
    if dry_run:
        print(f"# deployment {dep.name}: state dir {state} (nothing submitted: --dry-run)", file=out)
        for job in jobs:
            after = [f"<{r} job ids>" for r in AFTER[job.role] if r in dep.roles]
            if job.role == "gateway":
                after += [u["job"] for u in dep.upstream_jobs]
            dep_opt = f" --dependency=after:{':'.join(after)}" if after else ""
            print(f"\n# ---- {job.label}: sbatch --parsable{dep_opt} {state}/scripts/{job.label}.sbatch", file=out)
            print(scripts[job.label], end="", file=out)
        print(f"\n# ---- task template ({state}/task-template.yaml)\n{task_template(dep)}", end="", file=out)
        return 0
    sbatch = _tool("sbatch")
    if (state / STATE_FILE).exists():
        previous = read_state(state)
        live = {j: s for j, s in job_states([j["job_id"] for j in previous["jobs"]]).items() if s in LIVE_STATES}
        if live:
            raise DeployError(f"deployment {dep.name} still has jobs {', '.join(sorted(live))}: "
                              f"`polar-mq deploy slurm stop --config {config}` first")
    from polar_mq import auth as tokens

    token = tokens.server_token("api")  # the deploying user's token: $POLAR_API_TOKEN or $POLAR_HOME/token
    if not token:
        raise DeployError("no token could be made")
    shutil.rmtree(state / "run", ignore_errors=True)
    for sub in ("scripts", "logs", "run"):
        (state / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(state, 0o700)  # published endpoints carry the Redis password
    if dep.hub_redis:
        _write_private(state / "redis.password", secrets.token_urlsafe(24) + "\n")
    (state / "task-template.yaml").write_text(task_template(dep))
    record: dict[str, Any] = {"name": dep.name, "config": str(Path(config).resolve()), "state": str(state),
                              "deployment": dep.to_dict(), "submitted_at": time.time(), "jobs": []}
    ids: dict[str, list[str]] = {}
    print(f"deployment {dep.name}: state dir {state}", file=out, flush=True)
    try:
        for job in jobs:
            path = state / "scripts" / f"{job.label}.sbatch"
            path.write_text(scripts[job.label])
            after = [i for r in AFTER[job.role] for i in ids.get(r, [])]
            if job.role == "gateway":  # the vLLM jobs named in upstream_jobs
                after += [u["job"] for u in dep.upstream_jobs]
            argv = [sbatch, "--parsable", *([f"--dependency=after:{':'.join(after)}"] if after else []), str(path)]
            res = subprocess.run(argv, capture_output=True, text=True, timeout=60)
            if res.returncode != 0:
                raise DeployError(f"sbatch {path} failed: {res.stderr.strip() or res.stdout.strip()}")
            job_id = res.stdout.strip().split(";")[0]
            ids.setdefault(job.role, []).append(job_id)
            record["jobs"].append({"job_id": job_id, "role": job.role, "index": job.index, "node": job.node,
                                   "script": str(path), "log": f"{state}/logs/{job.label}-{job_id}.out"})
            (state / STATE_FILE).write_text(json.dumps(record, indent=1))
            print(f"submitted {job_id} {job.role}{f' on {job.node}' if job.node else ''}  "
                  f"(log {state}/logs/{job.label}-{job_id}.out)", file=out, flush=True)
    except BaseException:
        started = [j["job_id"] for j in record["jobs"]]
        if started:  # a half deployment is worse than none: cancel what this run submitted
            subprocess.run(["scancel", *started], capture_output=True, timeout=60)
            print(f"cancelled {' '.join(started)} after the failure", file=sys.stderr)
        raise
    print(f"token: `polar-mq token` (file {tokens.TokenSettings.from_env().token_file} or $POLAR_API_TOKEN); "
          f"task template: {state}/task-template.yaml (runtime.backend {dep.sandbox})", file=out)
    if wait > 0:
        api, gateways = wait_up(state, record, wait)
        print(f"api {api}", file=out)
        for g in gateways:
            print(f"gateway {g}", file=out)
    else:
        print(f"`polar-mq deploy slurm status --config {config}` shows the API and gateway URLs once the hub is up",
              file=out)
    return 0


def wait_up(state: Path, record: dict[str, Any], timeout: float) -> tuple[str, list[str]]:
    """Wait until the API and a gateway are published and answer /health; DeployError naming the
    jobs that failed (and their logs) when one ends first or time runs out."""
    import requests

    deadline = time.time() + timeout
    ids = [j["job_id"] for j in record["jobs"]]
    while True:
        api, gateways = endpoints(state)
        if api and gateways:
            try:
                if requests.get(f"{api}/health", timeout=2).ok and requests.get(f"{gateways[0]}/health", timeout=2).ok:
                    return api, gateways
            except requests.RequestException:
                pass
        states = job_states(ids)
        dead = [j for j in record["jobs"] if states[j["job_id"]] not in LIVE_STATES]
        if dead or time.time() > deadline:
            what = "; ".join(f"{j['job_id']} {j['role']} {states[j['job_id']]} (log {j['log']})" for j in dead)
            raise DeployError(f"deployment not up: {what or f'no API and gateway after {timeout:g} s'}")
        time.sleep(1)


def _find_state(config: str | None) -> Path:
    if config:
        return state_dir(load(config).name)
    root = state_root()
    names = sorted(p.name for p in root.iterdir() if (p / STATE_FILE).exists()) if root.is_dir() else []
    if len(names) == 1:
        return root / names[0]
    if not names:
        raise DeployError(f"no deployment under {root}: deploy one first")
    raise DeployError(f"several deployments under {root} ({', '.join(names)}): name one with --config FILE")


def status(config: str | None, *, out: Any = sys.stdout) -> int:
    """`api URL`, `gateway URL` (one line per gateway) and `JOBID ROLE STATE` per recorded job."""
    state = _find_state(config)
    record = read_state(state)
    api, gateways = endpoints(state)
    states = job_states([j["job_id"] for j in record["jobs"]])
    print(f"api {api or '-'}", file=out)
    for g in gateways or ["-"]:
        print(f"gateway {g}", file=out)
    for job in record["jobs"]:
        print(f"{job['job_id']} {job['role']} {states[job['job_id']]}", file=out)
    return 0


def stop(config: str | None, *, wait: float = 60.0, out: Any = sys.stdout) -> int:
    """scancel exactly the recorded job ids (those still live), wait for them to end, report."""
    state = _find_state(config)
    record = read_state(state)
    ids = [j["job_id"] for j in record["jobs"]]
    live = [i for i, s in job_states(ids).items() if s in LIVE_STATES]
    if live:
        res = subprocess.run([_tool("scancel"), *live], capture_output=True, text=True, timeout=60)
        if res.returncode != 0:
            raise DeployError(f"scancel {' '.join(live)} failed: {res.stderr.strip()}")
    deadline = time.time() + wait
    states = job_states(ids)
    while any(s in LIVE_STATES for s in states.values()) and time.time() < deadline:
        time.sleep(1)
        states = job_states(ids)
    shutil.rmtree(state / "run", ignore_errors=True)  # the published endpoints are gone with their jobs
    for job in record["jobs"]:
        print(f"{job['job_id']} {job['role']} {states[job['job_id']]}", file=out)
    still = [i for i, s in states.items() if s in LIVE_STATES]
    if still:
        print(f"still ending after {wait:g} s: {' '.join(still)}", file=sys.stderr)
        return 1
    return 0


def _main(args: argparse.Namespace) -> int:
    try:
        if args.action == "status":
            return status(args.config)
        if args.action == "stop":
            return stop(args.config)
        if args.action is not None:
            print(f"error: unknown action {args.action!r} (status or stop)", file=sys.stderr)
            return 2
        if not args.config:
            print("error: --config FILE is required to deploy", file=sys.stderr)
            return 2
        return deploy(args.config, dry_run=args.dry_run, wait=args.wait)
    except (ConfigError, DeployError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError) else 1


def add_command(sub: argparse._SubParsersAction) -> None:
    """`polar-mq deploy slurm [status|stop] [--config FILE] [--dry-run] [--wait S]`."""
    deploy_p = sub.add_parser("deploy", help="start the roles on a cluster scheduler (slurm)")
    targets = deploy_p.add_subparsers(dest="target", required=True)
    sl = targets.add_parser("slurm", help="the roles as Slurm jobs: deploy, or `status` / `stop` them")
    sl.add_argument("action", nargs="?", choices=["status", "stop"],
                    help="report or end the jobs this deployment started (default: deploy)")
    sl.add_argument("--config", help="the deployment description (YAML; examples/slurm/)")
    sl.add_argument("--dry-run", action="store_true", help="print the sbatch scripts, submit nothing")
    sl.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                    help="after submitting, wait until the API and a gateway answer, then print their URLs")
    sl.set_defaults(func=_main)
