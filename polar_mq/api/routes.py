"""The rollout endpoints: submit, status, results, cancel, sessions, task list.

Tests: tests/api/test_api.py, tests/api/test_fuzz_api.py.
"""

from __future__ import annotations

import math
import time
from typing import Any

import yaml
from flask import Blueprint, Response, jsonify, request

from polar_mq import states
from polar_mq._io import jsonsafe
from polar_mq.store import retention
from polar_mq.store.pipeline import Conflict
from polar_mq.taskspec import ValidationError, parse_task
from polar_mq.tasks.app.routing import INIT_TASK, STAGE_QUEUE
from polar_mq.tasks.app.endings import finish_early
from polar_mq.tasks.app import early_stop
from polar_mq.tasks.app.priority import level
from polar_mq.api import admission, views
from polar_mq.api.auth import principal
from polar_mq.api.context import ctx
from polar_mq.api.problems import Problem, not_found, validation

bp = Blueprint("tasks", __name__)

YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml")
# Broker hiccups: retry a little, then answer 503 rather than hang the request.
SEND_RETRY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.5}


def _body() -> Any:
    raw = request.get_data(cache=False)
    if not raw.strip():
        raise validation("body", "is empty; send a TaskRequest as JSON or YAML")
    mimetype = (request.mimetype or "").lower()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise validation("body", "must be UTF-8")
    # Only what can be stored gets in (jsonsafe): NaN, lone surrogates, >64-bit integers, deep
    # nesting, YAML dates / binary / non-string keys are 400s naming the place, never 500s.
    try:
        if mimetype in YAML_TYPES:
            try:
                data = yaml.safe_load(text)
            except yaml.YAMLError as exc:
                raise validation("body", f"invalid YAML: {exc}")
            except RecursionError:
                raise validation("body", "YAML nested too deeply")
            jsonsafe.check(data)
            return data
        return jsonsafe.loads(text)
    except jsonsafe.BodyError as exc:
        raise validation(exc.where or "body", exc.message)


def _float_arg(name: str, *, minimum: float | None = None, maximum: float | None = None) -> float | None:
    value = request.args.get(name)
    if value is None or value == "":
        return None
    try:
        number = float(value)
    except ValueError:
        raise Problem(400, f"query parameter {name!r} must be a number", kind="validation-error", field=name)
    if not math.isfinite(number) or (minimum is not None and number < minimum) \
            or (maximum is not None and number > maximum):
        raise Problem(400, f"query parameter {name!r} out of range", kind="validation-error", field=name)
    return number


def _int_arg(name: str, default: int, maximum: int) -> int:
    value = request.args.get(name)
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except ValueError:
        raise Problem(400, f"query parameter {name!r} must be an integer", kind="validation-error", field=name)
    if number < 0 or number > maximum:
        raise Problem(400, f"query parameter {name!r} must be between 0 and {maximum}",
                      kind="validation-error", field=name)
    return number


def _enqueue_init(session_ids: list[str], priority: int = 0) -> None:
    """A task's init messages in one pipelined write (kombu's Producer.batch) instead of one
    round trip each: a round trip per session costs the API more than the session's own
    bookkeeping (bench/bench_dispatch.py). A failed batch is sent again whole, with the
    per-message retry policy (SEND_RETRY); a message that got through twice is a duplicate
    delivery, which init skips."""
    c = ctx()
    lvl = {"priority": level(priority)} if priority else {}  # dispatch_priority (tasks/priority.py)
    tries = int(SEND_RETRY["max_retries"]) + 1
    for attempt in range(tries):
        try:
            with c.celery.producer_or_acquire() as producer, producer.batch():
                for sid in session_ids:
                    c.celery.send_task(INIT_TASK, args=[sid], queue=STAGE_QUEUE[INIT_TASK], producer=producer,
                                       **lvl)
            return
        except Exception:
            if attempt == tries - 1:
                raise
            time.sleep(min(SEND_RETRY["interval_max"],
                           SEND_RETRY["interval_start"] + attempt * SEND_RETRY["interval_step"]))


@bp.post("/v1/tasks")
def submit() -> tuple[Response, int]:
    data = _body()
    try:
        task = parse_task(data)
        admission.check_builder(task)
    except ValidationError as exc:
        raise validation(exc.field, exc.message)
    admission.check_submit(task, principal())  # callback_url, and a non-admin token's policy: 400/403
    c = ctx()
    try:
        who = principal()
        sids, created = c.store.create_task(task, submitter=None if who.admin else who.name)
    except Conflict as exc:
        raise Problem(409, f"{exc}; use a new task_id or resubmit the identical body", kind="conflict",
                      task_id=task.task_id)
    marker = c.enqueued_key(task.task_id)
    if created:
        _enqueue_init(sids, task.dispatch_priority)
        c.redis.set(marker, 1)
    elif not c.redis.exists(marker):
        # A previous submit stored the task but did not finish enqueueing (broker down, crash):
        # hand the still-registered sessions to init again. Stage workers ignore duplicates.
        waiting = [r.session_id for r in c.store.get_sessions(sids) if r.state == states.REGISTERED]
        _enqueue_init(waiting, task.dispatch_priority)
        c.redis.set(marker, 1)
    resp = jsonify({"task_id": task.task_id, "session_ids": sids})
    if created:
        resp.headers["Location"] = f"/v1/tasks/{task.task_id}"
    return resp, 202 if created else 200


def _task_or_404(task_id: str) -> dict[str, Any]:
    stored = ctx().store.get_task(task_id)
    if stored is None:
        raise not_found("task", task_id)
    return stored


@bp.get("/v1/tasks")
def list_tasks() -> Response:
    c = ctx()
    limit = _int_arg("limit", 50, 1000)
    out = []
    for task_id in c.store.list_tasks(limit):
        stored = c.store.get_task(task_id)
        if stored is None:
            continue
        records = c.store.get_sessions(c.store.session_ids(task_id))
        out.append(views.task_status(task_id, stored, records, cancelled=c.store.is_cancelled(task_id),
                                     sessions=False))
    return jsonify({"tasks": out})


@bp.get("/v1/tasks/<task_id>")
def task_status(task_id: str) -> Response:
    c = ctx()
    stored = _task_or_404(task_id)
    records = c.store.get_sessions(c.store.session_ids(task_id))
    body = views.task_status(task_id, stored, records, cancelled=c.store.is_cancelled(task_id))
    body.update(early_stop.view(c.store, task_id))  # cancelled by a user vs. early-stopped sessions
    body["request"] = stored.get("spec")  # the TaskRequest as stored
    body["callbacks"] = c.store.callbacks(task_id)  # signed deliveries: delivered | retrying | dead_letter
    return jsonify(body)


@bp.get("/v1/tasks/<task_id>/results")
def task_results(task_id: str) -> Response:
    c = ctx()
    _task_or_404(task_id)
    status = views.parse_status_filter(request.args.get("status"))
    min_reward = _float_arg("min_reward")
    offset = _int_arg("offset", 0, 10**7)
    limit = _int_arg("limit", 100_000, 100_000)
    sids = c.store.session_ids(task_id)
    records = c.store.get_sessions(sids)
    trajectories: list[dict[str, Any]] = []
    without: list[dict[str, Any]] = []
    for rec in records[offset: offset + limit]:
        traj = c.store.get_trajectory(rec.session_id)
        if traj is None:
            if min_reward is None and (status is None or rec.state in status):
                without.append({"session_id": rec.session_id, "state": rec.state, "error": rec.error})
            continue
        if views.trajectory_matches(traj, status, min_reward):
            trajectories.append(traj.to_dict())
    if records and all(states.is_terminal(r.state) for r in records):
        # Exported: the finished task's Redis data expires after the retention (retention.py).
        retention.mark_exported(c.redis, c.keys, task_id, c.settings.retention_seconds, gw=c.gateway_redis)
    return jsonify({
        "task_id": task_id,
        "state": views.overall_state(records),
        "total_sessions": len(sids),
        "offset": offset,
        "count": len(trajectories),
        "trajectories": trajectories,
        "sessions_without_trajectory": without,
    })


@bp.delete("/v1/tasks/<task_id>")
def cancel(task_id: str) -> tuple[Response, int]:
    c = ctx()
    _task_or_404(task_id)
    c.store.cancel_task(task_id)
    sids = c.store.session_ids(task_id)
    # Queued sessions end now (empty ERROR trajectory + callbacks, as a worker would do);
    # running ones are stopped by their run worker, which polls the cancel flag.
    stage_ctx = c.stage_context()
    task = c.store.task_request(task_id)
    for rec in c.store.get_sessions(sids):
        if rec.state == states.REGISTERED and task is not None:
            finish_early(stage_ctx, rec, task, states.ERROR, "cancelled", expect={states.REGISTERED})
    records = c.store.get_sessions(sids)
    return jsonify({
        "task_id": task_id,
        "cancelled": True,
        "state": views.overall_state(records),
        "sessions": [{"session_id": r.session_id, "state": r.state, "error": r.error} for r in records],
    }), 202


@bp.get("/v1/sessions/<session_id>")
def session(session_id: str) -> Response:
    rec = ctx().store.get_session(session_id)
    if rec is None:
        raise not_found("session", session_id)
    body = rec.to_dict()
    body["durations"] = views.durations(rec)
    return jsonify(body)
