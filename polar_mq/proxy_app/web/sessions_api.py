"""The gateway's own HTTP resources: health, sessions, captured calls and trajectories.

Errors here are JSON problem details (RFC 9457), not provider shapes: callers are our own
pipeline and scripts, not harnesses.

Tests: tests/gateway/test_gateway.py, tests/api/test_api.py.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from flask import Flask, Response, jsonify, request

from polar_mq import sampling
from polar_mq import auth as tokens
from polar_mq.store.core import StoreUnavailable

if TYPE_CHECKING:
    from polar_mq.proxy_app.core import Gateway


def problem(status: int, title: str, detail: str) -> Response:
    resp = jsonify({"type": "about:blank", "title": title, "status": status, "detail": detail})
    resp.status_code = status
    resp.content_type = "application/problem+json"
    return resp


def register(app: Flask, gw: "Gateway") -> None:
    token = gw.settings.admin_token

    def authorised() -> bool:
        """The admin token (constant-time compare). A session key is never an admin token; only a
        gateway started with --dev and no token is open (it said so at start)."""
        if not token:
            return True
        return tokens.equal(tokens.bearer(request.headers.get("Authorization")), token)

    @app.before_request
    def _admin_only() -> Response | None:
        if (request.path == "/sessions" or request.path.startswith("/sessions/")) and not authorised():
            resp = problem(401, "Unauthorized", "the gateway's /sessions resources need the admin token "
                           "(Authorization: Bearer <token>; see $POLAR_HOME/token)")
            resp.headers["WWW-Authenticate"] = 'Bearer realm="polar-mq-gateway"'
            return resp
        return None

    @app.route("/", methods=["GET", "HEAD"])
    @app.route("/s/<key>", methods=["GET", "HEAD"])
    @app.route("/s/<key>/", methods=["GET", "HEAD"])
    def root(key: str | None = None) -> Response:
        # Claude Code sends HEAD to its base URL (/ or /s/<key>) before its first call; it ignores
        # the answer, but a 200 keeps logs clean. No session data is revealed here.
        return jsonify({"service": "polar_mq gateway", "health": "/health"})

    @app.get("/health")
    def health() -> Response:
        try:
            redis_ok = gw.store.ping()
        except StoreUnavailable:
            redis_ok = False
        ups = gw.pool.describe()
        token_ids = bool(ups) and all(u["token_ids"] for u in ups if u["healthy"])
        ok = redis_ok and any(u["healthy"] for u in ups)
        warnings = []
        if not token_ids:
            warnings.append("an upstream does not return token ids: captured calls are not trainable")
        return jsonify({"status": "ok" if ok and token_ids else "degraded", "redis": redis_ok,
                        "served_model": gw._served_model, "token_ids": token_ids,
                        "tito": gw.tito.describe(), "upstreams": ups, "warnings": warnings,
                        # "lean": plain provider calls on lean_worker's path; else the server's own
                        "http": app.config.get("POLAR_HTTP_PATH", "server")})

    @app.post("/sessions")
    def create_session() -> Response:
        body: Any = request.get_json(silent=True) if request.get_data() else {}
        if body is None or not isinstance(body, dict):
            return problem(400, "Bad Request", "body must be a JSON object (or empty)")
        for name, typ in (("session_id", str), ("task_id", str), ("metadata", dict)):
            if body.get(name) is not None and not isinstance(body[name], typ):
                return problem(400, "Bad Request", f"field '{name}' must be a {typ.__name__}")
        try:
            policy = sampling.validate(body.get("sampling"), "sampling")
        except sampling.PolicyError as exc:
            return problem(400, "Bad Request", str(exc))
        session_id = body.get("session_id") or uuid.uuid4().hex
        try:
            session, created = gw.store.create_session(session_id, body.get("task_id"), body.get("metadata"),
                                                       policy)
        except StoreUnavailable as exc:
            return problem(503, "Service Unavailable", str(exc))
        if not created and not token:
            # An open (--dev) gateway cannot tell the session's owner from anyone else: an existing
            # session's key is only ever handed to the holder of the admin token.
            return problem(409, "Conflict", f"session {session_id!r} exists; its key is only returned "
                           "to the admin token")
        resp = jsonify({"session_id": session.session_id, "key": session.key,
                        "base_urls": gw.base_urls(session.key), "task_id": session.task_id,
                        "metadata": session.metadata, "sampling": session.sampling, "created": created,
                        "max_model_len": gw.pool.max_model_len()})
        resp.status_code = 201 if created else 200
        return resp

    @app.get("/sessions/<session_id>")
    def get_session(session_id: str) -> Response:
        try:
            session = gw.store.get_session(session_id)
            if session is None:
                return problem(404, "Not Found", f"no session {session_id!r}")
            inflight = gw.store.inflight_calls(session_id)
            cancelled = gw.store.is_session_cancelled(session_id)
        except StoreUnavailable as exc:
            return problem(503, "Service Unavailable", str(exc))
        return jsonify({**session.to_dict(), "base_urls": gw.base_urls(session.key),
                        "inflight_calls": inflight, "cancelled": cancelled})

    @app.post("/sessions/<session_id>/cancel")
    def cancel_session(session_id: str) -> Response:
        """Nobody wants this session's generations any more (task cancelled, harness stopped at
        its budget): calls in flight are aborted upstream, new ones are refused (403)."""
        if not authorised():
            return problem(401, "Unauthorized", "a valid bearer token is required")
        try:
            if gw.store.get_session(session_id) is None:
                return problem(404, "Not Found", f"no session {session_id!r}")
            gw.store.cancel_session(session_id)
            # This process's calls stop at once; the other processes' watchers read the flag.
            gw.registry.abort_session(session_id)
            inflight = gw.store.inflight_calls(session_id)
        except StoreUnavailable as exc:
            return problem(503, "Service Unavailable", str(exc))
        return jsonify({"session_id": session_id, "cancelled": True, "inflight_calls": inflight})

    @app.get("/sessions/<session_id>/calls")
    def calls(session_id: str) -> Response:
        try:
            session = gw.store.get_session(session_id)
            if session is None:
                return problem(404, "Not Found", f"no session {session_id!r}")
            records = gw.store.calls(session_id)
        except StoreUnavailable as exc:
            return problem(503, "Service Unavailable", str(exc))
        calls = [r.to_dict() for r in records]
        role = (session.metadata or {}).get("role")
        if role:  # e.g. a rubric judge's session (graders/rubric.py): every record says so
            for call in calls:
                call["metadata"] = {**(call.get("metadata") or {}), "role": role}
        return jsonify({"session_id": session_id, "calls": calls})

    @app.get("/sessions/<session_id>/trajectory")
    def trajectory(session_id: str) -> Response:
        builder = request.args.get("builder", "per_request")
        try:
            session = gw.store.get_session(session_id)
            if session is None:
                return problem(404, "Not Found", f"no session {session_id!r}")
            records = gw.store.calls(session_id)
        except StoreUnavailable as exc:
            return problem(503, "Service Unavailable", str(exc))
        from polar_mq import merge
        try:
            traj = merge.build(builder, records, None, session_id=session_id, task_id=session.task_id)
        except (ValueError, ImportError) as exc:
            return problem(400, "Bad Request", str(exc))
        return jsonify(traj.to_dict())
