"""What a stage needs: settings, the pipeline store, the gateway and a way to enqueue stages."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import time

import requests

from ..merge.records import as_record
from ..model import CaptureRecord
from .pipeline_store import PipelineStore, node_name
from ..settings import PipelineSettings


MODEL_LEN_MAX_AGE = 60.0


class GatewayClient:
    """The stages talk to the gateway over HTTP only (never through its internals)."""

    def __init__(self, url: str, token: str | None = None):
        self.url = url.rstrip("/")
        self.http = requests.Session()
        self._max_model_len: tuple[float, int | None] | None = None
        if token:
            self.http.headers["Authorization"] = f"Bearer {token}"

    def create_session(self, session_id: str, task_id: str, metadata: dict[str, Any],
                       sampling: dict[str, Any] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"session_id": session_id, "task_id": task_id, "metadata": metadata}
        if sampling:
            body["sampling"] = sampling
        resp = self.http.post(f"{self.url}/sessions", json=body, timeout=30)
        resp.raise_for_status()
        return resp.json()

    def cancel(self, session_id: str) -> None:
        """Abort the session's generations upstream (best effort: the harness is gone anyway)."""
        try:
            self.http.post(f"{self.url}/sessions/{session_id}/cancel", timeout=10)
        except requests.RequestException:
            pass

    def wait_idle(self, session_id: str, timeout: float) -> int:
        """Wait (bounded) until none of the session's calls is in flight at the gateway, so that
        a call that was running when the harness stopped is in the records; returns how many
        still were in flight when the wait ended (0: all recorded)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                resp = self.http.get(f"{self.url}/sessions/{session_id}", timeout=10)
                n = int(resp.json().get("inflight_calls") or 0) if resp.ok else 0
            except (requests.RequestException, ValueError):
                n = 0
            if n == 0 or time.monotonic() >= deadline:
                return n
            time.sleep(0.2)

    def max_model_len(self) -> int | None:
        """The served model's context length, as the gateway's upstreams report it (asked once a
        minute per process: it is the same for every session of a run)."""
        now = time.monotonic()
        if self._max_model_len is None or now - self._max_model_len[0] > \
                (MODEL_LEN_MAX_AGE if self._max_model_len[1] is not None else 5.0):
            self._max_model_len = (now, self._ask_max_model_len())
        return self._max_model_len[1]

    def _ask_max_model_len(self) -> int | None:
        try:
            ups = self.http.get(f"{self.url}/health", timeout=10).json().get("upstreams") or []
        except (requests.RequestException, ValueError):
            return None
        lens = [u.get("max_model_len") for u in ups if isinstance(u.get("max_model_len"), int)]
        return min(lens) if lens else None

    def calls(self, session_id: str) -> list[CaptureRecord]:
        """The session's recorded calls, as records (none for a session the gateway lost)."""
        resp = self.http.get(f"{self.url}/sessions/{session_id}/calls", timeout=60)
        if resp.status_code == 404:
            return []
        resp.raise_for_status()
        return [as_record(call, session_id) for call in resp.json()["calls"]]


@dataclass
class StageContext:
    settings: PipelineSettings
    store: PipelineStore
    gateway: GatewayClient
    enqueue: Callable[[str, str], None]  # (task name, session id)
    node: str = ""

    def __post_init__(self) -> None:
        self.node = self.node or node_name()
