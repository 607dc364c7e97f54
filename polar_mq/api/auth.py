"""Who may make a request: the admin token (every right) or a scoped token's role (roles.py).

Every route but the public ones needs `Authorization: Bearer <token>` when `settings.api_token`
is set (constant-time comparison for the admin token; scoped tokens are looked up by their sha256).
Unknown, expired or revoked token → 401; a request outside the token's rights → 403 naming the
right it lacks; a `submit` token reaches only the tasks it submitted (tests/trust/test_trust_roles.py).
"""

from __future__ import annotations

import hmac
from typing import Callable

from flask import g, request

from polar_mq.api.roles import ADMIN_PRINCIPAL, Principal, TokenStore, rule
from polar_mq.api.problems import Problem

PUBLIC_PATHS = frozenset({"/health", "/openapi.json"})
_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="polar-mq"'}
_INVALID = {"WWW-Authenticate": 'Bearer realm="polar-mq", error="invalid_token"'}


def principal() -> Principal:
    """The sender of the current request (the admin principal when the API runs open)."""
    return g.get("principal") or ADMIN_PRINCIPAL


def identify(token: str, expected: str, tokens: TokenStore) -> Principal | None:
    """The principal `token` stands for: the admin token, a live scoped token, else None."""
    if hmac.compare_digest(token.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass")):
        return ADMIN_PRINCIPAL
    return tokens.lookup(token)


def check_bearer(expected: str | None, tokens: TokenStore | None = None,
                 owner_of: Callable[[str | None, str | None], str | None] | None = None) -> None:
    """Raise a 401/403 Problem unless the request's bearer token allows it; sets g.principal.
    `owner_of(task_id, session_id)`: the submitter of the task a path names (None: no such task)."""
    if not expected or request.path in PUBLIC_PATHS:
        g.principal = ADMIN_PRINCIPAL
        return
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Problem(401, "missing bearer token (Authorization: Bearer <token>)", kind="unauthorized",
                      headers=_CHALLENGE)
    who = identify(token.strip(), expected, tokens) if tokens is not None else (
        ADMIN_PRINCIPAL if hmac.compare_digest(token.strip().encode(), expected.encode()) else None)
    if who is None:
        raise Problem(401, "invalid bearer token (unknown, expired or revoked)", kind="unauthorized",
                      headers=_INVALID)
    g.principal = who
    authorise(who, owner_of)


def authorise(who: Principal, owner_of: Callable[[str | None, str | None], str | None] | None) -> None:
    """403 unless `who` may make the current request."""
    if who.admin:
        return
    r = rule(request.method, request.path)
    if who.role in r.roles:
        return
    if who.role in r.own:
        owner = owner_of(r.task_id, r.session_id) if owner_of is not None else None
        if owner is None or owner == who.name:  # no such task: the route answers 404
            return
        raise Problem(403, f"token {who.name!r} (role {who.role}) may only reach the tasks it submitted; "
                           f"this one was submitted by another token (right {r.right_needed()} covers "
                           f"only its own tasks)", kind="forbidden",
                      missing_right=sorted(r.roles)[0] if r.roles else "admin")
    raise Problem(403, f"token {who.name!r} (role {who.role}) lacks the right {r.right_needed()} needed for "
                       f"{request.method} {request.path}", kind="forbidden",
                  missing_right=sorted(r.roles | r.own)[0] if (r.roles | r.own) else "admin")
