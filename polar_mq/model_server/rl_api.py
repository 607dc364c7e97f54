"""vLLM 0.32's RL endpoints on the stand-in (vLLM serves them with `VLLM_SERVER_DEV_MODE=1`,
`vllm/entrypoints/rl/online/api_router.py`), same paths and bodies:

- `POST /pause?mode=abort|wait|keep` → `{"status": "paused"}` (an unknown mode: 422 as FastAPI);
  generations that arrive while paused wait until `/resume`, as vLLM's paused scheduler does;
- `POST /resume` → `{"status": "resumed"}`; `GET /is_paused` → `{"is_paused": bool}`;
- `POST /update_weight_version {"new_version": str}` → `{"success": true, "new_version"}`;
- `GET /weight_info` → `{"weight_version"}` ("default" until set, as vLLM's engine core).
The stand-in has no weights to swap; the rest of vLLM's weight-transfer API is not offered.
"""

from __future__ import annotations

import json
import threading

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
            return _json({"detail": [{"type": "literal_error", "loc": ["query", "mode"],
                                      "msg": "Input should be 'abort', 'wait' or 'keep'", "input": mode}]}, 422)
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
        if not isinstance(version, str):
            return _json({"detail": [{"type": "missing", "loc": ["body", "new_version"], "msg": "Field required",
                                      "input": body}]}, 422)
        state.weight_version = version
        return _json({"success": True, "new_version": version})

    @app.get("/weight_info")
    def weight_info():
        return _json({"weight_version": state.weight_version})

    return state
