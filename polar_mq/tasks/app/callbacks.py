"""Signed callbacks to the trainer, and their delivery state (never silence).

Each callback is a POST of JSON with these headers, so a receiver can trust and de-duplicate it:

- ``X-Polar-Signature: sha256=<hex>``: HMAC-SHA256 keyed by the callback secret
  (POLAR_CALLBACK_SECRET, else $POLAR_HOME/callback.secret; never a service token, see
  callback_guard.py) over ``<X-Polar-Timestamp>.<raw body>`` (polar_mq.auth.sign / verify).
  Receivers should also refuse timestamps far from their clock (replays).
- ``X-Polar-Timestamp``: unix seconds when this attempt was signed.
- ``X-Polar-Event``: ``session.finished`` or ``task.finished``; ``X-Polar-Delivery``: the delivery id
  (the same on every retry of one callback).

Retries back off exponentially (settings.callback_retries, callback_backoff); every attempt is
recorded in the task's callback states (``GET /v1/tasks/<id>`` → ``callbacks``), and a callback
whose retries are spent ends there as ``dead_letter`` with its last error. Redirects are not
followed (a 3xx is a failed attempt), and a URL callback_guard refuses is dead-lettered at once.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import requests

from polar_mq import auth as tokens
from polar_mq.store.pipeline import PipelineStore


def message(url: str, event: str, task_id: str, payload: dict[str, Any], session_id: str | None = None) -> str:
    """The queued form of one callback (a fresh delivery id)."""
    return json.dumps({"url": url, "event": event, "task_id": task_id, "session_id": session_id,
                       "delivery_id": uuid.uuid4().hex, "payload": payload, "created_at": time.time()})


def signed_headers(body: bytes, secret: str | None, event: str, delivery_id: str) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "User-Agent": "polar-mq-callback",
               "X-Polar-Event": event, "X-Polar-Delivery": delivery_id}
    if secret:
        ts = str(int(time.time()))
        headers.update({tokens.TIMESTAMP_HEADER: ts, tokens.SIGNATURE_HEADER: tokens.sign(body, secret, ts)})
    return headers


def deliver(data: dict[str, Any], secret: str | None, timeout: float = 30.0) -> str | None:
    """One attempt; None when the receiver answered 2xx, else the error."""
    body = json.dumps(data["payload"]).encode()
    try:
        resp = requests.post(data["url"], data=body, timeout=timeout, allow_redirects=False,
                             headers=signed_headers(body, secret, data.get("event") or "", data.get("delivery_id") or ""))
    except requests.RequestException as exc:
        return f"{type(exc).__name__}: {exc}"[:500]
    if 300 <= resp.status_code < 400:
        return f"receiver answered {resp.status_code} (redirects are not followed)"
    if not 200 <= resp.status_code < 300:
        return f"receiver answered {resp.status_code}"
    return None


def record(store: PipelineStore, data: dict[str, Any], state: str, attempts: int, error: str | None) -> None:
    if not data.get("task_id") or not data.get("delivery_id"):
        return
    store.record_callback(data["task_id"], data["delivery_id"], {
        "delivery_id": data["delivery_id"], "event": data.get("event"), "session_id": data.get("session_id"),
        "url": data["url"], "state": state, "attempts": attempts, "last_error": error,
        "created_at": data.get("created_at"), "updated_at": time.time()})
