"""The Flask app factory of the rollout API.

Tests: tests/api/test_api.py, tests/api/test_fuzz_api.py.
"""

from __future__ import annotations

import logging
from typing import Any

import redis
from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException

from polar_mq.store.pipeline import PipelineStore
from polar_mq.settings import PipelineSettings
from polar_mq.store.core import StoreUnavailable, connect
from polar_mq.taskspec import ValidationError
from polar_mq.api import admin, groups, ops, routes, tokens_api
from polar_mq.api.ui import routes as ui
from polar_mq.api.ui import auth as ui_auth
from polar_mq.api.roles import ADMIN, TokenStore
from polar_mq.api.auth import check_bearer
from polar_mq.api.context import EXTENSION, ApiContext
from polar_mq.api.problems import Problem, unavailable, validation

log = logging.getLogger("polar_mq.api")

MAX_BODY_BYTES = 16 * 1024 * 1024


def _broker_errors() -> tuple[type[BaseException], ...]:
    try:
        from kombu.exceptions import OperationalError
    except ImportError:  # pragma: no cover
        return ()
    return (OperationalError,)


def create_app(settings: PipelineSettings, *, redis_client: redis.Redis | None = None,
               celery: Any = None) -> Flask:
    app = Flask("polar_mq.api")
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    client = redis_client if redis_client is not None else connect(settings.redis_url)
    store = PipelineStore(client)
    app.extensions[EXTENSION] = ApiContext(settings=settings, redis=client, store=store, _celery=celery)
    scoped = TokenStore(client, store.keys)  # roles.py: scoped tokens, looked up per request

    def owner_of(task_id: str | None, session_id: str | None) -> str | None:
        if session_id is not None:
            rec = store.get_session(session_id)
            task_id = rec.task_id if rec is not None else None
        stored = store.get_task(task_id) if task_id else None
        return None if stored is None else str(stored.get("submitter") or ADMIN)

    @app.before_request
    def _auth() -> Response | None:
        if request.path == ui_auth.PREFIX or request.path.startswith(ui_auth.PREFIX + "/"):
            # the viewer: bearer, ?token= or its cookie (admin or a `read` token)
            return ui_auth.authorise(settings.api_token, scoped)
        check_bearer(settings.api_token, scoped, owner_of)
        return None

    app.register_blueprint(routes.bp)
    app.register_blueprint(admin.bp)
    app.register_blueprint(groups.bp)
    app.register_blueprint(ops.bp)
    app.register_blueprint(tokens_api.bp)
    ui.register(app)

    @app.errorhandler(Problem)
    def _problem(exc: Problem) -> Response:
        return exc.response()

    @app.errorhandler(ValidationError)
    def _validation(exc: ValidationError) -> Response:
        return validation(exc.field, exc.message).response()

    @app.errorhandler(HTTPException)
    def _http(exc: HTTPException) -> Response:
        status = exc.code or 500
        detail = exc.description or exc.name
        resp = Problem(status, detail, title=exc.name).response()
        if status == 405 and exc.get_response().headers.get("Allow"):
            resp.headers["Allow"] = exc.get_response().headers["Allow"]
        return resp

    def _down(exc: Exception) -> Response:
        log.warning("backend unavailable: %s", exc)
        return unavailable(f"redis/broker unavailable: {exc}").response()

    for exc_type in (redis.ConnectionError, redis.TimeoutError, StoreUnavailable, *_broker_errors()):
        app.register_error_handler(exc_type, _down)

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception) -> Response:
        log.exception("unhandled error")
        return Problem(500, f"internal error: {type(exc).__name__}: {exc}").response()

    return app
