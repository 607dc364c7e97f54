"""vLLM 0.32's RL endpoints on the stand-in (vLLM serves them with `VLLM_SERVER_DEV_MODE=1`,
`vllm/entrypoints/rl/online/api_router.py`), same paths and bodies:

- `POST /pause?mode=abort|wait|keep` → `{"status": "paused"}` (an unknown mode: vLLM's 400
  validation error, `param: "query.mode"`);
  generations that arrive while paused wait until `/resume`, as vLLM's paused scheduler does;
- `POST /resume` → `{"status": "resumed"}`; `GET /is_paused` → `{"is_paused": bool}`;
- `POST /update_weight_version {"new_version": str}` → `{"success": true, "new_version"}`;
- `GET /weight_info` → `{"weight_version"}` ("default" until set, as vLLM's engine core).
The stand-in has no weights to swap; the rest of vLLM's weight-transfer API is not offered.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from flask import Flask, Response, request

GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions")
MODES = ("abort", "wait", "keep")
MAX_HOLD = 3600.0


class RLState:
    def __init__(self) -> None:
        self.running = threading.Event()
        self.running.set()
        self.weight_version = "default"


def _json(body: object, status: int = 200) -> Response:
    return Response(json.dumps(body), status=status, mimetype="application/json")


def _invalid(kind: str, loc: str, msg: str, value: object, **ctx: str) -> Response:
    """vLLM's answer to a request-validation error: its ErrorResponse, 400, `param` = the field."""
    detail: dict[str, Any] = {"type": kind, "loc": loc, "msg": msg, "input": str(value)}
    if ctx:
        detail["ctx"] = ctx
    return _json({"error": {"message": f"1 validation error:\n  {detail}", "type": "Bad Request",
                            "param": loc, "code": 400}}, 400)


def register(app: Flask) -> RLState:
    state = RLState()

    @app.before_request
    def _hold_while_paused():
        if request.method == "POST" and request.path in GENERATION_PATHS and not state.running.is_set():
            state.running.wait(MAX_HOLD)

    @app.post("/pause")
    def pause():
        mode = request.args.get("mode", "abort")
        if mode not in MODES:
            return _invalid("literal_error", "query.mode", "Input should be 'abort', 'wait' or 'keep'", mode,
                            expected="'abort', 'wait' or 'keep'")
        state.running.clear()
        return _json({"status": "paused"})

    @app.post("/resume")
    def resume():
        state.running.set()
        return _json({"status": "resumed"})

    @app.get("/is_paused")
    def is_paused():
        return _json({"is_paused": not state.running.is_set()})

    @app.post("/update_weight_version")
    def update_weight_version():
        body = request.get_json(silent=True)
        version = body.get("new_version") if isinstance(body, dict) else None
        if version is None:
            return _invalid("missing", "body.new_version", "Field required", None)
        if not isinstance(version, str):
            return _invalid("string_type", "body.new_version", "Input should be a valid string", version)
        state.weight_version = version
        return _json({"success": True, "new_version": version})

    @app.get("/weight_info")
    def weight_info():
        return _json({"weight_version": state.weight_version})

    return state
