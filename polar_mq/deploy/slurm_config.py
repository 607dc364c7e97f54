"""The description of a Slurm deployment (`polar-mq deploy slurm --config FILE`), read and checked.

A YAML mapping (docs/deployment.md, "Slurm"; examples/slurm/*.yaml)::

    name: NAME                    # the deployment; its state lives in $POLAR_HOME/slurm/NAME/
    sandbox: apptainer            # runtime.backend of the generated task template
    redis: hub                    # `hub`: the hub job runs redis-server with a generated password;
                                  # or the URL of a Redis every node can reach
    upstreams: [http://gpu1:8000] # vLLM server roots; or `standin: true` (a stand-in model server job)
    upstream_jobs: [{job: 4242, port: 8000}]   # or: the Slurm jobs that serve vLLM (their node, that port)
    network: {bind: 0.0.0.0, advertise: hostname}   # what services listen on / the address others use
    defaults: {partition: P, cpus: 1, mem: 2G, time: "7-00:00:00"}
    roles:
      hub:     {nodelist: head1, api_port: 8700, redis_port: 6379}
      standin: {port: 8000}
      gateway: {port: 8600}       # one per run node (placement: the run role's unless given)
      init:    {partition: cpu, count: 2, concurrency: 8}
      run:     {nodelist: "gpu[1-2]", concurrency: 16}
      postrun: {partition: cpu, concurrency: 4}
    env: {POLAR_LEASE_TTL: "30"}  # extra environment for every role
    preflight_timeout: 120        # s a role waits for the hub / its upstream before failing its job

Every mistake is a `ConfigError` naming the key (tests/deploy/test_slurm.py::test_config_errors_name_the_key).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROLES = ("hub", "standin", "gateway", "init", "run", "postrun")
STAGES = ("init", "run", "postrun")
SANDBOXES = ("apptainer", "docker", "bwrap", "local")
PLACEMENT_KEYS = ("partition", "nodelist", "count", "cpus", "mem", "time", "account", "qos", "sbatch")
ROLE_KEYS = {"hub": ("api_port", "redis_port"), "standin": ("port", "args"), "gateway": ("port", "args"),
             "init": ("concurrency",), "run": ("concurrency",), "postrun": ("concurrency",)}
DEFAULT_PORTS = {"api_port": 8700, "redis_port": 6379, "standin": 8000, "gateway": 8600}
DEFAULT_CONCURRENCY = {"init": 2, "run": 4, "postrun": 2}  # = polar_mq.cli.commands.STAGE_CONCURRENCY
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


class ConfigError(ValueError):
    """A deployment description that cannot be deployed; the message names the key."""


@dataclass
class Role:
    """One role's placement (sbatch options) and its own settings. `count` jobs are submitted;
    a `nodelist` places one job on each of its nodes instead."""

    name: str
    partition: str | None = None
    nodelist: str | None = None
    count: int = 1
    cpus: int = 1
    mem: str | None = None
    time: str | None = None
    account: str | None = None
    qos: str | None = None
    sbatch: list[str] = field(default_factory=list)  # extra `#SBATCH` option lines, as written
    port: int = 0  # hub: the API port; standin / gateway: their port (0: a free one at start)
    redis_port: int = 0
    concurrency: int = 0
    args: list[str] = field(default_factory=list)  # extra command-line arguments of the service


@dataclass
class Deployment:
    name: str
    sandbox: str
    redis: str  # "hub" or a URL
    upstreams: list[str]
    standin: bool
    bind: str
    advertise: str  # "hostname", "fqdn" or a literal address
    roles: dict[str, Role]
    env: dict[str, str]
    preflight_timeout: float
    python: str | None = None
    upstream_jobs: list[dict[str, Any]] = field(default_factory=list)  # {"job": "4242", "port": 8000}

    @property
    def hub_redis(self) -> bool:
        return self.redis == "hub"

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Deployment:
        roles = {k: Role(**v) for k, v in data["roles"].items()}
        return cls(**{**data, "roles": roles})


def _int(value: Any, key: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{key}: expected an integer >= {minimum}, got {value!r}")
    return value


def _str(value: Any, key: str) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{key}: expected a non-empty string, got {value!r}")
    if "\n" in value:
        raise ConfigError(f"{key}: must be one line")
    return value.strip()


def _mapping(value: Any, key: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{key}: expected a mapping, got {type(value).__name__}")
    return value


def _role(name: str, spec: dict[str, Any], defaults: dict[str, Any]) -> Role:
    allowed = set(PLACEMENT_KEYS) | set(ROLE_KEYS[name])
    for key in spec:
        if key not in allowed:
            raise ConfigError(f"roles.{name}.{key}: unknown key (allowed: {', '.join(sorted(allowed))})")
    merged = {**{k: v for k, v in defaults.items() if k in PLACEMENT_KEYS}, **spec}
    role = Role(name=name)
    where = f"roles.{name}"
    for key in ("partition", "nodelist", "mem", "time", "account", "qos"):
        if merged.get(key) is not None:
            setattr(role, key, _str(merged[key], f"{where}.{key}"))
    if merged.get("count") is not None:
        role.count = _int(merged["count"], f"{where}.count", 1)
    if merged.get("cpus") is not None:
        role.cpus = _int(merged["cpus"], f"{where}.cpus", 1)
    extra = merged.get("sbatch") or []
    if not isinstance(extra, list):
        raise ConfigError(f"{where}.sbatch: expected a list of sbatch options")
    role.sbatch = [_str(x, f"{where}.sbatch") for x in extra]
    args = merged.get("args") or []
    if not isinstance(args, list):
        raise ConfigError(f"{where}.args: expected a list of arguments")
    role.args = [_str(x, f"{where}.args") for x in args]
    if name == "hub":
        role.port = _int(merged.get("api_port", DEFAULT_PORTS["api_port"]), f"{where}.api_port")
        role.redis_port = _int(merged.get("redis_port", DEFAULT_PORTS["redis_port"]), f"{where}.redis_port")
    elif name in ("standin", "gateway"):
        role.port = _int(merged.get("port", DEFAULT_PORTS[name]), f"{where}.port")
    else:
        role.concurrency = _int(merged.get("concurrency", DEFAULT_CONCURRENCY[name]), f"{where}.concurrency", 1)
    return role


def parse(data: Any, *, source: str = "config") -> Deployment:
    """Check a loaded YAML document and fill the defaults."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a YAML mapping at the top level")
    known = {"name", "sandbox", "redis", "upstreams", "upstream_jobs", "standin", "network", "defaults", "roles", "env",
             "preflight_timeout", "python"}
    for key in data:
        if key not in known:
            raise ConfigError(f"{key}: unknown key (allowed: {', '.join(sorted(known))})")
    name = _str(data.get("name", "polar"), "name")
    if not _NAME.match(name):
        raise ConfigError(f"name: {name!r} must be letters, digits, '.', '_' or '-' (a directory and job name)")
    sandbox = _str(data.get("sandbox", "apptainer"), "sandbox")
    if sandbox not in SANDBOXES:
        raise ConfigError(f"sandbox: {sandbox!r} is not one of {', '.join(SANDBOXES)}")
    redis = _str(data.get("redis", "hub"), "redis")
    if redis != "hub" and not redis.startswith(("redis://", "rediss://", "redis+sentinel://", "unix://")):
        raise ConfigError("redis: `hub` (start one in the hub job) or a redis:// URL")
    raw_up = data.get("upstreams") or []
    if isinstance(raw_up, str):
        raw_up = [raw_up]
    if not isinstance(raw_up, list):
        raise ConfigError("upstreams: expected a list of vLLM server roots")
    upstreams = [_str(u, "upstreams").rstrip("/") for u in raw_up]
    for u in upstreams:
        if not u.startswith(("http://", "https://")):
            raise ConfigError(f"upstreams: {u!r} is not an http(s) URL")
    standin = data.get("standin", False)
    if not isinstance(standin, bool):
        raise ConfigError("standin: expected true or false")
    raw_jobs = data.get("upstream_jobs") or []
    if not isinstance(raw_jobs, list):
        raise ConfigError("upstream_jobs: expected a list of {job: ID, port: PORT}")
    upstream_jobs = []
    for i, item in enumerate(raw_jobs):
        if not isinstance(item, dict) or set(item) - {"job", "port"} or "job" not in item:
            raise ConfigError(f"upstream_jobs[{i}]: expected {{job: ID, port: PORT}}")
        job = _str(item["job"], f"upstream_jobs[{i}].job")
        if not job.isdigit():
            raise ConfigError(f"upstream_jobs[{i}].job: {job!r} is not a Slurm job id")
        upstream_jobs.append({"job": job, "port": _int(item.get("port", 8000), f"upstream_jobs[{i}].port", 1)})
    if sum(map(bool, (upstreams, upstream_jobs, standin))) != 1:
        raise ConfigError("upstreams: give exactly one of the vLLM servers' roots (upstreams), the Slurm jobs "
                          "that serve them (upstream_jobs), or `standin: true` for the stand-in model server")
    network = _mapping(data.get("network"), "network")
    for key in network:
        if key not in ("bind", "advertise"):
            raise ConfigError(f"network.{key}: unknown key (allowed: advertise, bind)")
    defaults = _mapping(data.get("defaults"), "defaults")
    for key in defaults:
        if key not in PLACEMENT_KEYS:
            raise ConfigError(f"defaults.{key}: unknown key (allowed: {', '.join(PLACEMENT_KEYS)})")
    specs = _mapping(data.get("roles"), "roles")
    for key in specs:
        if key not in ROLES:
            raise ConfigError(f"roles.{key}: unknown role (roles: {', '.join(ROLES)})")
    roles: dict[str, Role] = {}
    for role_name in ROLES:
        if role_name == "standin" and not standin:
            if "standin" in specs:
                raise ConfigError("roles.standin: set `standin: true` to start the stand-in model server")
            continue
        spec = _mapping(specs.get(role_name), f"roles.{role_name}")
        if role_name == "gateway":  # a gateway on each run node: the run role's placement by default
            run_spec = _mapping(specs.get("run"), "roles.run")
            spec = {**{k: run_spec[k] for k in ("partition", "nodelist", "count") if k in run_spec}, **spec}
        roles[role_name] = _role(role_name, spec, defaults)
    for role in roles.values():
        if role.nodelist:
            expand_hostlist(role.nodelist)  # a host list that cannot be read fails here, not in sbatch
    if roles["hub"].nodelist and len(expand_hostlist(roles["hub"].nodelist)) != 1:
        raise ConfigError("roles.hub.nodelist: the hub runs on one node")
    env = _mapping(data.get("env"), "env")
    for k, v in env.items():
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", str(k)):
            raise ConfigError(f"env.{k}: not an environment variable name")
    timeout = data.get("preflight_timeout", 120)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ConfigError("preflight_timeout: expected seconds > 0")
    python = data.get("python")
    return Deployment(name=name, sandbox=sandbox, redis=redis, upstreams=upstreams, standin=standin,
                      bind=_str(network.get("bind", "0.0.0.0"), "network.bind"),
                      advertise=_str(network.get("advertise", "hostname"), "network.advertise"),
                      roles=roles, env={str(k): _str(v, f"env.{k}") for k, v in env.items()},
                      preflight_timeout=float(timeout), upstream_jobs=upstream_jobs,
                      python=_str(python, "python") if python is not None else None)


def expand_hostlist(nodelist: str) -> list[str]:
    """Slurm's host list syntax, as `scontrol show hostnames` expands it: `gpu-[001-003,7],head`
    → gpu-001 gpu-002 gpu-003 gpu-7 head (zero padding kept; several bracket groups multiply)."""
    names: list[str] = []
    depth, start = 0, 0
    parts = []
    for i, ch in enumerate(nodelist + ","):
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(nodelist[start:i].strip())
            start = i + 1
    for part in filter(None, parts):
        match = re.search(r"\[([^\]]*)\]", part)
        if not match:
            names.append(part)
            continue
        head, tail = part[:match.start()], part[match.end():]
        for item in match.group(1).split(","):
            lo, _, hi = item.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                raise ConfigError(f"nodelist: cannot read {part!r}")
            for n in range(int(lo), int(hi or lo) + 1):
                names += expand_hostlist(f"{head}{str(n).zfill(len(lo))}{tail}")
    return names


def load(path: str | Path) -> Deployment:
    import yaml

    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    return parse(data, source=str(path))
