"""Redis ACL users per role, generated from one secret source (`polar-mq redis-acl`).

Roles and what each may touch (key patterns for the default prefix ``pmq``):

* ``hub`` (rollout API, `polar-mq gc`, scoped-token commands, Flower) and ``worker`` (the stage
  pools, with the janitor in them): the pipeline's keys ``pmq:*`` and Celery's (the stage queues
  ``init*``/``run*``/``postrun*`` with their priority and per-node variants, ``_kombu.*``,
  ``unacked*``, pidbox reply queues), every pub/sub channel (Celery events, remote control).
* ``gateway``: only its own keys, ``pmq:gw:*`` (sessions, captured calls, pause, versions),
  ``pmq:traj:*`` (a deleted gateway session takes its trajectories), ``pmq:hist:*`` and
  ``pmq:metrics``, and *read-only* ``pmq:auth:*`` (scoped tokens); no task, session, lease or
  Celery key.
* ``admin`` (an operator's `redis-cli` / `polar-mq status --cluster`): everything.
* ``replica`` and ``sentinel``: what replication and Sentinel monitoring need (docs/deployment.md,
  "Redis ACL users"), nothing else.

Every non-admin role is refused ``@dangerous`` and ``@admin`` commands (FLUSHALL, FLUSHDB, CONFIG,
ACL, DEBUG, SHUTDOWN, MODULE, KEYS, MONITOR, ...) and ``SCRIPT FLUSH|KILL``/``FUNCTION``; ``hub``
and ``worker`` keep INFO (read-only; the API's /metrics and `polar-mq gc` report memory); the
``default`` user is off, so a URL without credentials gets NOAUTH. The ACL file holds sha256 hashes
of the passwords, never the passwords (``#<hex>``); the passwords and the per-role URLs go in a
0600 env file. Tests: tests/trust/test_trust_redis.py (a real redis-server with this file, the
whole pipeline on role URLs, NOPERM per role).
"""

from __future__ import annotations

import hashlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

ROLES = ("hub", "worker", "gateway", "admin")
SERVER_ROLES = ("replica", "sentinel")  # users for Redis's own peers (Sentinel deployments)
DENIED = "-@dangerous -@admin -script|flush -script|kill -function"
CELERY_KEYS = ("_kombu.*", "unacked*", "init*", "run*", "postrun*", "celery*", "*.reply.celery.pidbox")


def role_rules(role: str, prefix: str = "pmq") -> str:
    """The ACL rules (after ``user NAME on #HASH``) of one role."""
    p = prefix
    if role in ("hub", "worker"):  # INFO: /metrics and `polar-mq gc` report Redis's memory
        keys = [f"~{p}:*", *(f"~{k}" for k in CELERY_KEYS)]
        return " ".join(["resetchannels", "&*", *keys, "+@all", DENIED, "+info"])
    if role == "gateway":
        keys = [f"~{p}:gw:*", f"~{p}:traj:*", f"~{p}:hist:*", f"~{p}:metrics", f"%R~{p}:auth:*"]
        return " ".join(["resetchannels", *keys, "+@all", DENIED])
    if role == "admin":
        return "~* &* +@all"
    if role == "replica":
        return "resetchannels -@all +psync +replconf +ping"
    if role == "sentinel":  # the documented minimum for a Sentinel watching this server
        return ("resetchannels &__sentinel__:hello -@all +multi +slaveof +ping +exec +subscribe "
                "+config|rewrite +role +publish +info +client|setname +client|kill +script|kill")
    raise ValueError(f"unknown Redis role {role!r} (one of {', '.join(ROLES + SERVER_ROLES)})")


def password_hash(password: str) -> str:
    return hashlib.sha256(password.encode()).hexdigest()


def acl_file_text(passwords: dict[str, str], prefix: str = "pmq") -> str:
    """An ACL file: the default user off, one user per role in `passwords` (hashed)."""
    lines = ["user default off resetkeys resetchannels -@all"]
    for role, password in passwords.items():
        lines.append(f"user {role} on #{password_hash(password)} {role_rules(role, prefix)}")
    return "\n".join(lines) + "\n"


def env_name(role: str) -> str:
    return f"POLAR_REDIS_{role.upper()}_PASSWORD"


def url_env_name(role: str) -> str:
    return f"POLAR_REDIS_URL_{role.upper()}"


def role_url(role: str, password: str, host: str, port: int, db: int = 0, *, tls: bool = False,
             ca_file: str | None = None) -> str:
    """``redis[s]://ROLE:PASSWORD@HOST:PORT/DB`` (TLS: the CA in the query, as redis-py and kombu read it)."""
    scheme = "rediss" if tls else "redis"
    url = f"{scheme}://{role}:{quote(password, safe='')}@{host}:{port}/{db}"
    if tls:
        url += "?ssl_cert_reqs=required" + (f"&ssl_ca_certs={quote(ca_file, safe='/')}" if ca_file else "")
    return url


@dataclass
class Generated:
    acl_file: Path
    env_file: Path
    passwords: dict[str, str]
    urls: dict[str, str]


def read_env_file(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            name, eq, value = line.partition("=")
            if eq and not name.lstrip().startswith("#"):
                out[name.strip()] = value.strip().strip("'\"")
    return out


def _write(path: Path, text: str, mode: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def generate(out_dir: Path, *, host: str = "127.0.0.1", port: int = 6379, db: int = 0,
             prefix: str = "pmq", tls: bool = False, ca_file: str | None = None,
             environ: dict[str, str] | None = None, sentinel: bool = False) -> Generated:
    """Write ``OUT/users.acl`` (hashes only, 0644: redis-server in its container runs as another
    user) and ``OUT/redis.env`` (the role passwords and URLs, 0600). A password comes from
    `environ` (``POLAR_REDIS_<ROLE>_PASSWORD``), else from an earlier ``redis.env`` in OUT (a
    rerun keeps them), else it is generated: one source for the ACL file and every role's URL."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    env_file = out_dir / "redis.env"
    earlier = read_env_file(env_file)
    environ = dict(os.environ if environ is None else environ)
    roles = ROLES + (SERVER_ROLES if sentinel else ())
    passwords = {r: environ.get(env_name(r)) or earlier.get(env_name(r)) or secrets.token_urlsafe(32)
                 for r in roles}
    urls = {r: role_url(r, passwords[r], host, port, db, tls=tls, ca_file=ca_file) for r in ROLES}
    acl = out_dir / "users.acl"
    _write(acl, acl_file_text(passwords, prefix), 0o644)
    lines = ["# polar-mq redis-acl: Redis ACL users per role (docs/deployment.md, 'Redis ACL users')",
             "# Give each host only its role's line(s); the hub host runs Redis with users.acl."]
    lines += [f"{env_name(r)}={passwords[r]}" for r in roles]
    lines += [f"{url_env_name(r)}={urls[r]}" for r in ROLES]
    lines.append(f"POLAR_REDIS_ACL_FILE={acl.resolve()}")  # compose/hub.yml mounts it into redis
    _write(env_file, "\n".join(lines) + "\n", 0o600)
    return Generated(acl_file=acl, env_file=env_file, passwords=passwords, urls=urls)


# ---- what a role says when its user lacks a permission -----------------------------------------

def probe_keys(role: str, prefix: str = "pmq") -> list[str]:
    """Keys a role must be allowed to read (EXISTS): one of its own per kind it touches."""
    if role == "gateway":
        return [f"{prefix}:gw:paused"]
    return [f"{prefix}:tasks", "_kombu.binding.init"]
