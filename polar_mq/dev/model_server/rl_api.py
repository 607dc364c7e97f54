"""vLLM 0.32's RL endpoints on the stand-in (vLLM serves them with `VLLM_SERVER_DEV_MODE=1`,
`vllm/entrypoints/rl/online/api_router.py`), same paths and bodies:

- `POST /pause?mode=abort|wait|keep` → `{"status": "paused"}` (an unknown mode: vLLM's 400
  validation error, `param: "query.mode"`);
  generations that arrive while paused wait until `/resume`, as vLLM's paused scheduler does;
- `POST /abort_requests {"request_ids": [...]}` → `{"status": "aborted", "aborted": n}`: stops
  those generations (vLLM's external ids, `chatcmpl-<X-Request-Id>`; none: every one); a plain
  call so stopped answers with what it sampled and finish_reason "abort" (the stand-in stops
  plain generations this way; streamed ones stop when their connection closes, as in vLLM);
- `POST /resume` → `{"status": "resumed"}`; `GET /is_paused` → `{"is_paused": bool}`;
- `POST /update_weight_version {"new_version": str}` → `{"success": true, "new_version"}`;
- `GET /weight_info` → `{"weight_version"}` ("default" until set, as vLLM's engine core).
The stand-in has no weights to swap; the rest of vLLM's weight-transfer API is not offered.

Tests: tests/gateway/test_pause.py; tests/vllm/test_contract.py.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from flask import Flask, Response, request

from polar_mq.dev.model_server.generations import GenerationLog

GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions")
MODES = ("abort", "wait", "keep")
MAX_HOLD = 3600.0


class RLState:
    def __init__(self) -> None:
        self.running = threading.Event()
        self.running.set()
        self.weight_version = "default"
        self.mode = "abort"  # of the last pause: "keep" freezes generations in flight too

    def hold_in_flight(self) -> None:
        """vLLM's pause mode keep: a running generation stops between two tokens until resume,
        then goes on (with the new weights, on a real engine)."""
        if self.mode == "keep" and not self.running.is_set():
            self.running.wait(MAX_HOLD)


def _json(body: object, status: int = 200) -> Response:
    return Response(json.dumps(body), status=status, mimetype="application/json")


def _invalid(kind: str, loc: str, msg: str, value: object, **ctx: str) -> Response:
    """vLLM's answer to a request-validation error: its ErrorResponse, 400, `param` = the field."""
    detail: dict[str, Any] = {"type": kind, "loc": loc, "msg": msg, "input": str(value)}
    if ctx:
        detail["ctx"] = ctx
    return _json({"error": {"message": f"1 validation error:\n  {detail}", "type": "Bad Request",
                            "param": loc, "code": 400}}, 400)


def _bad_request(message: str) -> Response:
    return _json({"error": {"message": message, "type": "Bad Request", "param": None, "code": 400}}, 400)


def register(app: Flask, generations: GenerationLog) -> RLState:
    state = RLState()

    @app.post("/abort_requests")
    def abort_requests():
        # vLLM 0.32's RL router: the ids are the requests' external ids (`chatcmpl-<X-Request-Id>`);
        # none (or an empty list) aborts every request in flight. Its HTTPExceptions come back as
        # vLLM's ErrorResponse (checked against real vLLM: tests/vllm/test_rl_vllm.py).
        try:
            body = json.loads(request.get_data() or b"null")
        except ValueError:
            return _bad_request("Invalid JSON format")
        if not isinstance(body, dict):
            return _bad_request("Request body must be a JSON object")
        ids = body.get("request_ids")
        if not ids:
            running = generations.snapshot()["running"]
            generations.abort([])
            return _json({"status": "aborted", "aborted": running})
        if isinstance(ids, str):  # vLLM takes one id as a string (and counts its characters)
            generations.abort([ids])
        elif isinstance(ids, list):
            generations.abort([str(i) for i in ids])
        else:
            return _json({"error": f"Failed to abort requests: '{type(ids).__name__}' object is not iterable"},
                         500)
        return _json({"status": "aborted", "aborted": len(ids)})

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
        state.mode = mode
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
