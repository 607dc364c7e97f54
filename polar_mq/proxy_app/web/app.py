"""The gateway's Flask app: everything but the provider calls (the sessions API, health, metrics,
token text, model lists, Codex's WebSocket probe). The provider calls are FastPath's (fastpath.py,
the endpoints of routes.py), installed here in front of Flask's WSGI app.

Tests: tests/gateway/test_gateway.py, tests/gateway/test_gateway_inprocess.py.
"""

from __future__ import annotations

import logging
from typing import Any

from flask import Flask, Response, jsonify, request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from polar_mq.settings import GatewaySettings
from polar_mq.store.wire import RedisWire
from polar_mq.store.core import GatewayStore
from polar_mq.auth import redact
from polar_mq.proxy_app.adapters.base import GatewayError
from polar_mq.proxy_app.core import Gateway, JsonReply, StreamReply, adapter, error_reply
from polar_mq.proxy_app.web.routes import GEMINI_ACTIONS, provider_for_path
from polar_mq.proxy_app.upstream.pool import UpstreamPool

log = logging.getLogger("polar_mq.gateway")


def to_response(reply: JsonReply | StreamReply) -> Response:
    if isinstance(reply, StreamReply):
        return Response(reply.frames, status=200, content_type=reply.content_type, headers=reply.headers)
    resp = jsonify(reply.body)
    resp.status_code = reply.status
    for name, value in reply.headers.items():
        resp.headers[name] = value
    return resp


def error_response(mod, err: GatewayError) -> Response:
    return to_response(error_reply(mod, err))


def redis_client(url: str, max_connections: int = 512):
    """The gateway's Redis client: `store.connect`'s timeouts, and a blocking pool, so that a
    thousand streams starting at once wait a moment for a connection instead of failing with
    "Too many connections" (redis-py's default pool raises past 100)."""
    from polar_mq.store.redis_url import client

    return client(url, blocking_pool=True, max_connections=max_connections, pool_timeout=10,
                  socket_connect_timeout=2, socket_timeout=5, health_check_interval=30)


def create_app(settings: GatewaySettings, *, store: GatewayStore | None = None,
               pool: UpstreamPool | None = None, startup_checks: bool = True) -> Flask:
    """The gateway's Flask app. `store` and `pool` default to a store on `settings.redis_url` and
    the upstream pool of `settings.upstreams`; a test passes its own (tests/support/mock_pool.py: the pool's
    interface over one answer function) and `startup_checks=False`, which skips probing upstreams,
    the health thread and the spool replay."""
    if store is None:
        if not settings.redis_url:
            raise ValueError("settings.redis_url is required")
        client = redis_client(settings.redis_url)
        store = GatewayStore(client, wire=RedisWire(client))
    if pool is None:
        pool = UpstreamPool(settings.upstreams, timeout=settings.upstream_timeout,
                            connect_timeout=settings.connect_timeout, retries=settings.retries,
                            backoff=settings.retry_backoff, health_interval=settings.health_interval)
    gw = Gateway(settings, store, pool)
    gw.pause.start()  # heartbeats: a pause's drain counts this process's calls while it lives
    if startup_checks:
        pool.check_all(settings.served_model)
        if settings.check_token_ids and not any(u.token_ids for u in pool.upstreams):
            log.error("no upstream confirmed that it returns token ids: %s", pool.describe())
        pool.start_health_thread(settings.served_model)
        try:
            gw.recorder.replay_spool()
        except Exception:  # a bad spool file must not stop the gateway
            log.exception("could not replay the spool")

    app = Flask("polar_mq.gateway")
    # Key order is data here (tool arguments, schemas render into prompts): never sort it.
    app.json.sort_keys = False  # type: ignore[attr-defined]  # DefaultJSONProvider's attribute
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes + 1024
    app.extensions["polar_gateway"] = gw

    def add(rule: str, endpoint: str, view, methods=("POST",), **options: Any) -> None:
        app.add_url_rule(rule, endpoint, view, methods=list(methods), **options)
        app.add_url_rule(f"/s/<key>{rule}", f"s_{endpoint}", view, methods=list(methods), **options)

    def responses_get(key: str | None = None) -> Response:
        # Codex first tries a WebSocket upgrade here; 426 makes it fall back to HTTP POST.
        body = {"error": {"message": "WebSocket transport is not supported; use HTTP POST",
                          "type": "invalid_request_error", "param": None, "code": "upgrade_required"}}
        resp = jsonify(body)
        resp.status_code = 426
        resp.headers["Upgrade"] = "HTTP/1.1"
        return resp

    add("/v1/responses", "responses_get", responses_get, methods=("GET",))
    # werkzeug routes WebSocket handshakes only to websocket rules: without this one they get 405.
    add("/v1/responses", "responses_ws", responses_get, methods=("GET",), websocket=True)

    def list_models(key: str | None = None) -> Response:
        name = gw._served_model or "unknown"
        return jsonify({"object": "list", "data": [{"id": name, "object": "model", "created": 0,
                                                     "owned_by": "polar_mq"}]})

    def list_gemini_models(key: str | None = None) -> Response:
        name = gw._served_model or "unknown"
        return jsonify({"models": [{"name": f"models/{name}", "displayName": name,
                                    "supportedGenerationMethods": list(GEMINI_ACTIONS)}]})

    add("/v1/models", "models", list_models, methods=("GET",))
    add("/v1beta/models", "gemini_models", list_gemini_models, methods=("GET",))

    from polar_mq.proxy_app import token_text
    from polar_mq.proxy_app.web import metrics
    from polar_mq.proxy_app.web import sessions_api
    sessions_api.register(app, gw)
    token_text.register(app, gw)
    metrics.install(app, gw)

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException):
        kind = {400: "invalid_request", 401: "authentication", 404: "not_found", 405: "invalid_request",
                413: "too_large"}.get(exc.code or 500, "internal")
        if isinstance(exc, RequestEntityTooLarge):
            msg = f"request body exceeds the gateway limit of {settings.max_body_bytes} bytes"
        else:
            msg = f"{exc.name}: {exc.description} ({request.method} {redact(request.path)})"
        err = GatewayError(kind, msg, status=exc.code)
        return error_response(adapter(provider_for_path(request.path)), err)

    @app.errorhandler(Exception)
    def unexpected(exc: Exception):
        log.exception("unhandled error on %s", redact(request.path))
        err = GatewayError("internal", f"gateway internal error: {type(exc).__name__}: {redact(str(exc))}")
        return error_response(adapter(provider_for_path(request.path)), err)

    # Every provider call is FastPath's (fastpath.py, routes.py); everything else is Flask's.
    from polar_mq.proxy_app.web.fastpath import FastPath
    app.wsgi_app = FastPath(app.wsgi_app, gw, settings.max_body_bytes)  # type: ignore[method-assign]
    return app
