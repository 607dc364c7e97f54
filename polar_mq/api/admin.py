"""Weight sync: pause every gateway (and every vLLM upstream that offers the RL API), drain the
generations in flight, resume with a new policy version.

`POST /v1/admin/pause?wait=S&mode=wait|abort|keep` sets the cluster-wide pause flag, waits up
to S seconds until no live gateway has a generation in flight (per-gateway counts; a gateway
with no heartbeat for HEARTBEAT_TTL is dead and does not block), then pauses the upstreams'
engines with `mode`. From the moment the flag is set no generation is admitted anywhere (see
polar_mq/store/pause.py). `POST /v1/admin/resume {"policy_version": V}` sets the upstreams' weight
version, resumes them, then sets V and lifts the flag in one transaction: every call admitted
after it is stamped `policy_version = V`.

Tests: tests/gateway/test_pause.py, tests/api/test_api.py.
"""

from __future__ import annotations

import time
from typing import Any

from flask import Blueprint, Response, jsonify, request

from polar_mq.store.pause import Drain, PauseState
from polar_mq.api import weights
from polar_mq.api.context import ctx
from polar_mq.api.problems import Problem
from polar_mq.api.routes import _float_arg

bp = Blueprint("admin", __name__)

POLL = 0.02
MODES = ("wait", "abort", "keep")


def _state() -> PauseState:
    c = ctx()
    return PauseState(c.redis, c.keys)


def _drain_body(state: PauseState, drain: Drain) -> dict[str, Any]:
    return {"in_flight": drain.in_flight, "in_flight_by_gateway": drain.gateways,
            "live_gateways": drain.live_gateways, "dead_gateways": drain.dead_gateways,
            "policy_version": state.policy_version()}


def _upstreams(state: PauseState) -> list[str]:
    urls: set[str] = set()
    for info in state.gateways().values():
        urls.update(u.rstrip("/") for u in info.get("upstreams") or [])
    return sorted(urls)


def _json_body() -> dict[str, Any]:
    raw = request.get_data(cache=True)
    if not raw.strip():
        return {}
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        raise Problem(400, "body must be a JSON object", kind="validation-error", field="body")
    return body


@bp.post("/v1/admin/pause")
def pause() -> Response:
    c = ctx()
    wait = _float_arg("wait", minimum=0, maximum=3600)
    wait = c.settings.pause_wait if wait is None else wait
    mode = request.args.get("mode") or "keep"
    if mode not in MODES:
        raise Problem(400, f"mode must be one of {', '.join(MODES)}", kind="validation-error", field="mode")
    state = _state()
    state.pause()
    deadline = time.monotonic() + wait
    drain = state.drain(ttl=c.settings.gateway_heartbeat_ttl)
    while drain.in_flight > 0 and time.monotonic() < deadline:
        time.sleep(min(POLL, max(0.0, deadline - time.monotonic())))
        drain = state.drain(ttl=c.settings.gateway_heartbeat_ttl)
    state.clear_dead(drain.dead_gateways)
    engines = weights.pause_all(_upstreams(state), mode, c.redis, c.keys)
    return jsonify({"paused": True, "drained": drain.in_flight == 0, **_drain_body(state, drain),
                    "mode": mode, "upstreams": engines})


@bp.post("/v1/admin/resume")
def resume() -> Response:
    c = ctx()
    body = _json_body()
    version = body.get("policy_version")
    if version is not None and (isinstance(version, bool) or not isinstance(version, int)):
        raise Problem(400, "policy_version must be an integer", kind="validation-error", field="policy_version")
    state = _state()
    began = time.time()  # the engines go on from here: a frozen stream's next token is newer
    engines = weights.resume_all(_upstreams(state), version, c.redis, c.keys)
    state.resume(version, at=began)
    drain = state.drain(ttl=c.settings.gateway_heartbeat_ttl)
    return jsonify({"paused": False, **_drain_body(state, drain), "upstreams": engines})


@bp.get("/v1/admin/status")
def status() -> Response:
    c = ctx()
    state = _state()
    since = state.paused_since()
    drain = state.drain(ttl=c.settings.gateway_heartbeat_ttl)
    gateways = state.gateways()
    now = time.time()
    return jsonify({
        "paused": since is not None,
        "paused_for_s": None if since is None else round(now - since, 3),
        **_drain_body(state, drain),
        "gateways": {gid: {**info, "alive": gid in drain.live_gateways,
                           "in_flight": drain.gateways.get(gid, 0)} for gid, info in gateways.items()},
        "upstreams": weights.recorded(c.redis, c.keys),
    })


@bp.get("/v1/admin/pause")
def pause_state() -> Response:
    c = ctx()
    state = _state()
    drain = state.drain(ttl=c.settings.gateway_heartbeat_ttl)
    return jsonify({"paused": state.paused_since() is not None, **_drain_body(state, drain)})
