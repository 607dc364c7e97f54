"""Scoped tokens over the API (admin token only; roles.rule gives them to no role):
`POST /v1/admin/tokens {"role", "name"?, "ttl_seconds"?}` answers the token once,
`GET /v1/admin/tokens` lists names, roles and expiry (never tokens), `DELETE /v1/admin/tokens/<name>`
revokes. `polar-mq token create|list|revoke` call these (cli_tokens.py)."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify, request

from polar_mq.api.roles import TokenError, TokenStore
from polar_mq.api.context import ctx
from polar_mq.api.problems import Problem, not_found

bp = Blueprint("tokens", __name__)


def _store() -> TokenStore:
    c = ctx()
    return TokenStore(c.redis, c.keys)


@bp.post("/v1/admin/tokens")
def create() -> tuple[Response, int]:
    body = request.get_json(silent=True) if request.get_data(cache=True).strip() else None
    if not isinstance(body, dict):
        raise Problem(400, 'body must be a JSON object {"role": "submit|train|read", "name"?, "ttl_seconds"?}',
                      kind="validation-error", field="body")
    role, name, ttl = body.get("role"), body.get("name"), body.get("ttl_seconds")
    if not isinstance(role, str):
        raise Problem(400, "role: must be submit, train or read", kind="validation-error", field="role")
    if name is not None and not isinstance(name, str):
        raise Problem(400, "name: must be a string", kind="validation-error", field="name")
    if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 0 < ttl < 1e10):
        raise Problem(400, "ttl_seconds: must be a positive number", kind="validation-error", field="ttl_seconds")
    try:
        made, token, expires_at = _store().create(role, name, float(ttl) if ttl is not None else None)
    except TokenError as exc:
        raise Problem(409 if "exists" in str(exc) else 400, str(exc), kind="validation-error")
    return jsonify({"name": made, "role": role, "token": token, "expires_at": expires_at}), 201


@bp.get("/v1/admin/tokens")
def listing() -> Response:
    return jsonify({"tokens": _store().list()})


@bp.delete("/v1/admin/tokens/<name>")
def revoke(name: str) -> Response:
    if not _store().revoke(name):
        raise not_found("token", name)
    return jsonify({"name": name, "revoked": True})
