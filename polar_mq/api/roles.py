"""Scoped API tokens: roles `submit`, `train` and `read` next to the admin token.

The admin token (POLAR_API_TOKEN / $POLAR_HOME/token, polar_mq.auth) keeps every right. Scoped
tokens are made with `polar-mq token create --role R` and live in Redis hashed (sha256; the token
itself is printed once and stored nowhere), so every API process sees a new or revoked token on
its next request: lookups are not cached (revocation is immediate; tests/trust/test_trust_roles.py).

Rights per role (`rule()` maps a request to the rights that allow it):
- ``submit``: POST /v1/tasks; GET/DELETE of the tasks it submitted (their results and sessions).
- ``train``:  /v1/groups/*; task status, results and sessions (GET); /v1/admin/pause|resume|status.
- ``read``:   GET only (the viewer /ui/, task and session status, results, /metrics), never a GET
              that changes state (GET /v1/groups/next leases groups).
Anything no rule names is for the admin token only.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any

import redis

from polar_mq.store.core import Keys

ROLES = ("submit", "train", "read")
ADMIN = "admin"
TOKEN_PREFIX = "pmq-tok-"  # "pmq-" so tokens.redact() shortens one that ends up in a log line
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
READS = frozenset({"GET", "HEAD"})

_TASK = re.compile(r"^/v1/tasks/([^/]+)(/results)?/?$")
_SESSION = re.compile(r"^/v1/sessions/([^/]+)/?$")


@dataclass(frozen=True)
class Principal:
    """Who sent a request: the admin token, or a scoped token's name and role."""

    name: str
    role: str

    @property
    def admin(self) -> bool:
        return self.role == ADMIN


ADMIN_PRINCIPAL = Principal(ADMIN, ADMIN)


@dataclass(frozen=True)
class Rule:
    """The roles that may make a request; `own`: roles allowed only on tasks they submitted."""

    roles: frozenset[str]
    own: frozenset[str] = frozenset()
    task_id: str | None = None  # the task the path names, when the right depends on its submitter
    session_id: str | None = None

    def right_needed(self) -> str:
        """The rights that would allow it, for the 403's detail."""
        names = sorted(self.roles | self.own)
        return " or ".join(f"'{n}'" for n in names) if names else f"'{ADMIN}'"


def rule(method: str, path: str) -> Rule:
    """Which roles may make `method path` (the admin token may make every request)."""
    method = method.upper()
    read = method in READS
    if path.rstrip("/") == "/v1/tasks" and method == "POST":
        return Rule(frozenset({"submit"}))
    m = _TASK.match(path)
    if m and (read or (method == "DELETE" and not m.group(2))):
        roles = frozenset({"read", "train"}) if read else frozenset()
        return Rule(roles, own=frozenset({"submit"}), task_id=m.group(1))
    m = _SESSION.match(path)
    if m and read:
        return Rule(frozenset({"read", "train"}), own=frozenset({"submit"}), session_id=m.group(1))
    if path.startswith("/v1/groups/") or path == "/v1/groups":
        mutating = not read or path.rstrip("/") == "/v1/groups/next"
        return Rule(frozenset({"train"}) if mutating else frozenset({"train", "read"}))
    if path.rstrip("/") in ("/v1/admin/pause", "/v1/admin/resume", "/v1/admin/status"):
        return Rule(frozenset({"train", "read"}) if read else frozenset({"train"}))
    if read and not path.startswith("/v1/admin/"):
        return Rule(frozenset({"read"}))
    return Rule(frozenset())


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


class TokenError(ValueError):
    """A create/revoke the store refuses (bad role, name taken, unknown name)."""


class TokenStore:
    """Scoped tokens in Redis: `pmq:auth:token:<sha256>` (expires with the token) and the name index."""

    def __init__(self, r: redis.Redis, keys: Keys | None = None):
        self.r = r
        self.keys = keys or Keys()

    def create(self, role: str, name: str | None = None, ttl: float | None = None) -> tuple[str, str, float | None]:
        """(name, token, expires_at): a new token of `role`, stored hashed; the token is not kept."""
        if role not in ROLES:
            raise TokenError(f"unknown role {role!r}; use one of {', '.join(ROLES)}")
        if ttl is not None and not ttl > 0:
            raise TokenError("--ttl must be a positive number of seconds")
        name = name or f"{role}-{secrets.token_hex(4)}"
        if not _NAME.fullmatch(name) or name == ADMIN:
            raise TokenError(f"invalid name {name!r}: 1-64 letters, digits, '_', '.', '-' (not 'admin')")
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        now = time.time()
        expires_at = now + ttl if ttl is not None else None
        d = digest(token)
        entry = {"name": name, "role": role, "created_at": now, "expires_at": expires_at, "digest": d}
        self._drop_expired()
        if not self.r.hsetnx(self.keys.api_token_names(), name, json.dumps(entry)):
            raise TokenError(f"a token named {name!r} exists; revoke it first or pick another --name")
        with self.r.pipeline() as pipe:
            pipe.hset(self.keys.api_token(d), mapping={"name": name, "role": role, "created_at": str(now),
                                                       "expires_at": "" if expires_at is None else str(expires_at)})
            if expires_at is not None:
                pipe.expireat(self.keys.api_token(d), int(expires_at) + 1)
            pipe.execute()
        return name, token, expires_at

    def list(self) -> list[dict[str, Any]]:
        """Every live token's name, role, created_at and expires_at (never the token, nor its hash)."""
        self._drop_expired()
        out = []
        for raw in self.r.hvals(self.keys.api_token_names()):
            entry = json.loads(raw)
            out.append({k: entry.get(k) for k in ("name", "role", "created_at", "expires_at")})
        return sorted(out, key=lambda e: (e["created_at"] or 0, e["name"]))

    def revoke(self, name: str) -> bool:
        """Delete the token named `name`; False when there is none."""
        raw = self.r.hget(self.keys.api_token_names(), name)
        if raw is None:
            return False
        entry = json.loads(raw)
        with self.r.pipeline() as pipe:
            pipe.delete(self.keys.api_token(entry["digest"]))
            pipe.hdel(self.keys.api_token_names(), name)
            pipe.execute()
        return True

    def lookup(self, token: str) -> Principal | None:
        """The principal a scoped token stands for; None when unknown, revoked or expired."""
        if not token.startswith(TOKEN_PREFIX):
            return None
        fields = self.r.hgetall(self.keys.api_token(digest(token)))
        if not fields:
            return None
        got = {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
               for k, v in fields.items()}
        expires = got.get("expires_at") or ""
        if expires and float(expires) <= time.time():
            return None
        if got.get("role") not in ROLES:
            return None
        return Principal(got["name"], got["role"])

    def live_digest(self, name: str) -> str | None:
        """The sha256 of the live token named `name` (the viewer's cookie check), else None."""
        raw = self.r.hget(self.keys.api_token_names(), name)
        if raw is None:
            return None
        d = str(json.loads(raw)["digest"])
        return d if self.r.exists(self.keys.api_token(d)) and self._live(d) else None

    def _live(self, d: str) -> bool:
        expires = self.r.hget(self.keys.api_token(d), "expires_at")
        return not expires or float(expires) > time.time()

    def _drop_expired(self) -> None:
        now = time.time()
        for name, raw in self.r.hgetall(self.keys.api_token_names()).items():
            entry = json.loads(raw)
            if entry.get("expires_at") is not None and entry["expires_at"] <= now:
                self.r.hdel(self.keys.api_token_names(), name)
