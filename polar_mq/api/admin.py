"""Gateway pause/resume: stop new generations (e.g. while the trainer swaps weights) and wait for
the ones in flight to finish."""

from __future__ import annotations

import time

from flask import Blueprint, Response, jsonify

from .context import ctx
from .routes import _float_arg

bp = Blueprint("admin", __name__)

POLL = 0.05


def _inflight() -> int:
    c = ctx()
    value = c.redis.get(c.keys.gateway_inflight())
    return max(0, int(value)) if value else 0


@bp.post("/v1/admin/pause")
def pause() -> Response:
    c = ctx()
    wait = _float_arg("wait", minimum=0, maximum=3600)
    wait = c.settings.pause_wait if wait is None else wait
    c.redis.set(c.keys.gateway_paused(), time.time())
    deadline = time.monotonic() + wait
    n = _inflight()
    while n > 0 and time.monotonic() < deadline:
        time.sleep(min(POLL, max(0.0, deadline - time.monotonic())))
        n = _inflight()
    return jsonify({"paused": True, "in_flight": n, "drained": n == 0})


@bp.post("/v1/admin/resume")
def resume() -> Response:
    c = ctx()
    c.redis.delete(c.keys.gateway_paused())
    return jsonify({"paused": False, "in_flight": _inflight()})


@bp.get("/v1/admin/pause")
def pause_state() -> Response:
    c = ctx()
    return jsonify({"paused": bool(c.redis.exists(c.keys.gateway_paused())), "in_flight": _inflight()})
