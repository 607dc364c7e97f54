"""Bearer-token check: every route but the public ones needs `Authorization: Bearer <token>` when
`settings.api_token` is set. Constant-time comparison."""

from __future__ import annotations

import hmac

from flask import request

from .problems import Problem

PUBLIC_PATHS = frozenset({"/health", "/openapi.json"})


def check_bearer(expected: str | None) -> None:
    """Raise a 401 Problem unless the request carries the expected bearer token."""
    if not expected or request.path in PUBLIC_PATHS:
        return
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Problem(401, "missing bearer token (Authorization: Bearer <token>)", kind="unauthorized",
                      headers={"WWW-Authenticate": 'Bearer realm="polar-mq"'})
    if not hmac.compare_digest(token.strip().encode(), expected.encode()):
        raise Problem(401, "invalid bearer token", kind="unauthorized",
                      headers={"WWW-Authenticate": 'Bearer realm="polar-mq", error="invalid_token"'})
