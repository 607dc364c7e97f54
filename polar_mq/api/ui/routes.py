"""The trajectory viewer: `/ui/` pages (plain HTML + one script, shipped as package data, no build
step) and the read-only JSON they load from `/ui/api/...`.

Pages: `/ui/` tasks, `/ui/tasks/<task_id>` its sessions, `/ui/sessions/<session_id>` one session
(stage timeline, grade, calls, every token of every trace), `/ui/groups/<task_id>` the samples of
a task side by side. Sign-in is `ui_auth`; the shapes are `ui_views`; calls and token texts come
from the gateway over HTTP (`ui_gateway`).

Tests: tests/api/test_ui.py, tests/api/test_ui_views.py.
"""

from __future__ import annotations

import time
from typing import Any

from flask import Blueprint, Flask, Response, jsonify, request, send_from_directory

from polar_mq import states
from polar_mq.model import Trajectory
from polar_mq.api.ui import auth as ui_auth
from polar_mq.api.ui import views as ui_views
from polar_mq.store.pause import PauseState
from polar_mq.tasks.app import early_stop
from polar_mq.api.context import ctx
from polar_mq.api.problems import Problem, not_found
from polar_mq.api.ui.gateway import GatewayReader, GatewayUnavailable
from polar_mq.api.ui.pages import STATIC, static_text

bp = Blueprint("ui", __name__, url_prefix=ui_auth.PREFIX)
bp.after_request(ui_auth.after_request)
_OVERVIEW_POOLS_TTL = 5.0
_pools_cache: dict[str, Any] = {"at": 0.0, "value": None}


def register(app: Flask) -> None:
    app.register_blueprint(bp)


def _gateway() -> GatewayReader:
    s = ctx().settings
    return GatewayReader(s.gateway_url, s.gateway_token)


# --- pages ------------------------------------------------------------------------------------------
def _shell() -> Response:
    resp = Response(static_text("index.html"), mimetype="text/html")
    resp.headers["Cache-Control"] = "no-store"
    return resp


@bp.get("/")
def index() -> Response:
    return _shell()


@bp.get("/tasks/<task_id>")
@bp.get("/sessions/<session_id>")
@bp.get("/groups/<task_id>")
def page(**_: str) -> Response:
    return _shell()


@bp.get("/static/<path:name>")
def static(name: str) -> Response:
    resp = send_from_directory(STATIC, name, max_age=0)
    resp.headers["Cache-Control"] = "no-cache"
    return resp


# --- JSON -------------------------------------------------------------------------------------------
def _limit(default: int = 200, maximum: int = 1000) -> int:
    try:
        n = int(request.args.get("limit", default))
    except ValueError:
        raise Problem(400, "query parameter 'limit' must be an integer", kind="validation-error", field="limit")
    if not 1 <= n <= maximum:
        raise Problem(400, f"query parameter 'limit' must be between 1 and {maximum}", kind="validation-error",
                      field="limit")
    return n


@bp.get("/api/tasks")
def api_tasks() -> Response:
    c = ctx()
    out = []
    for task_id in c.store.list_tasks(_limit()):
        stored = c.store.get_task(task_id)
        if stored is None:
            continue
        records = c.store.get_sessions(c.store.session_ids(task_id))
        out.append(ui_views.task_list_entry(task_id, stored, records, c.store.is_cancelled(task_id)))
    return jsonify({"tasks": out, "now": time.time()})


def _task(task_id: str) -> dict[str, Any]:
    stored = ctx().store.get_task(task_id)
    if stored is None:
        raise not_found("task", task_id)
    return stored


@bp.get("/api/tasks/<task_id>")
def api_task(task_id: str) -> Response:
    c = ctx()
    stored = _task(task_id)
    records = c.store.get_sessions(c.store.session_ids(task_id))
    return jsonify({**ui_views.task_view(task_id, stored, records, c.store.is_cancelled(task_id)),
                    **early_stop.view(c.store, task_id), "now": time.time()})


def _session_page(session_id: str) -> dict[str, Any]:
    """The session, its trajectory (the stored result, else built live by the gateway while the
    session runs) and its calls."""
    c = ctx()
    rec = c.store.get_session(session_id)
    if rec is None:
        raise not_found("session", session_id)
    stored = c.store.get_task(rec.task_id) or {}
    spec = stored.get("spec") or {}
    traj = c.store.get_trajectory(session_id)
    source = "result" if traj is not None else None
    calls: list[dict[str, Any]] = []
    calls_error = None
    if rec.gateway_session_id:
        gw = _gateway()
        try:
            calls = gw.calls(rec.gateway_session_id)
            if traj is None and not states.is_terminal(rec.state):
                builder = (spec.get("builder") or {}).get("strategy") or "prefix_merging"
                live = gw.trajectory(rec.gateway_session_id, builder)
                if live:
                    traj, source = Trajectory.from_dict(live), "live"
        except GatewayUnavailable as exc:
            calls_error = str(exc)
    elif not states.is_terminal(rec.state):
        calls_error = "the session has no gateway session yet (it has not been initialised)"
    return ui_views.session_view(rec, spec, traj, source, calls, calls_error)


@bp.get("/api/sessions/<session_id>")
def api_session(session_id: str) -> Response:
    return jsonify(_session_page(session_id))


@bp.get("/api/sessions/<session_id>/tokens")
def api_session_tokens(session_id: str) -> Response:
    """The text of every token id the session page shows, from the gateway's tokenizer."""
    ids = ui_views.token_ids(_session_page(session_id))
    if not ids:
        return jsonify({"model": None, "texts": {}, "error": None})
    try:
        model, texts = _gateway().token_texts(ids)
    except GatewayUnavailable as exc:
        return jsonify({"model": None, "texts": {}, "error": str(exc)})
    return jsonify({"model": model, "texts": texts, "error": None})


@bp.get("/api/sessions/<session_id>/calls/<int:index>")
def api_session_call(session_id: str, index: int) -> Response:
    rec = ctx().store.get_session(session_id)
    if rec is None:
        raise not_found("session", session_id)
    if not rec.gateway_session_id:
        raise not_found("call", str(index))
    try:
        calls = _gateway().calls(rec.gateway_session_id)
    except GatewayUnavailable as exc:
        raise Problem(503, str(exc), kind="gateway-unavailable")
    if index >= len(calls):
        raise not_found("call", str(index))
    return jsonify(ui_views.call_detail(index, calls[index]))


@bp.get("/api/groups/<task_id>")
def api_group(task_id: str) -> Response:
    c = ctx()
    stored = _task(task_id)
    records = c.store.get_sessions(c.store.session_ids(task_id))
    trajs = {r.session_id: t for r in records if (t := c.store.get_trajectory(r.session_id)) is not None}
    return jsonify(ui_views.group_view(task_id, stored, records, trajs))


def _pools() -> dict[str, Any]:
    """Celery workers per stage queue (asked of the workers; cached a few seconds)."""
    now = time.monotonic()
    if _pools_cache["value"] is not None and now - _pools_cache["at"] < _OVERVIEW_POOLS_TTL:
        return _pools_cache["value"]
    pools: dict[str, Any] = {}
    error = None
    try:
        inspect = ctx().celery.control.inspect(timeout=1.0)
        queues = inspect.active_queues() or {}
        stats = inspect.stats() or {}
        active = inspect.active() or {}
        for worker, qs in queues.items():
            concurrency = ((stats.get(worker) or {}).get("pool") or {}).get("max-concurrency")
            for q in qs:
                pool = pools.setdefault(q.get("name"), {"workers": 0, "concurrency": 0, "busy": 0})
                pool["workers"] += 1
                pool["concurrency"] += int(concurrency or 0)
                pool["busy"] += len(active.get(worker) or [])
    except Exception as exc:  # the broker may be down: the rest of the overview still shows
        error = f"{type(exc).__name__}: {exc}"
    value = {"pools": pools, "error": error}
    _pools_cache.update(at=now, value=value)
    return value


@bp.get("/api/overview")
def api_overview() -> Response:
    """What `polar-mq top` shows: stage pools, queues, READY occupancy, sessions by state."""
    from collections import Counter

    from polar_mq.api.ops import queue_lengths

    c = ctx()
    active = c.store.get_sessions(c.store.active_sessions())
    by_state = Counter(r.state for r in active)
    counters = c.store.counters()
    finished = {s: int(counters.get(f"sessions_{s.lower()}", 0)) for s in sorted(states.TERMINAL)}
    pools = _pools()
    return jsonify({
        "now": time.time(),
        "queues": queue_lengths(),
        "pools": pools["pools"], "pools_error": pools["error"],
        "ready": {"length": len(c.store.ready_list()), "slots_held": len(c.store.slots_held()),
                  "capacity": c.store.ready_capacity(c.settings.ready_capacity)},
        "sessions": {s: by_state.get(s, 0) for s in states.ORDER},
        "finished": finished,
        "paused": bool(c.redis.exists(c.keys.gateway_paused())),
        "inflight": PauseState(c.redis, c.keys).drain().in_flight,
        "tasks": c.store.list_tasks(10),
    })
