"""What a stage needs: settings, the pipeline store, the gateway and a way to enqueue stages."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import requests

from ..pipeline_store import PipelineStore, node_name
from ..settings import PipelineSettings


class GatewayClient:
    """The stages talk to the gateway over HTTP only (never through its internals)."""

    def __init__(self, url: str, token: str | None = None):
        self.url = url.rstrip("/")
        self.http = requests.Session()
        if token:
            self.http.headers["Authorization"] = f"Bearer {token}"

    def create_session(self, session_id: str, task_id: str, metadata: dict[str, Any]) -> dict[str, Any]:
        resp = self.http.post(f"{self.url}/sessions", json={"session_id": session_id, "task_id": task_id,
                                                            "metadata": metadata}, timeout=30)
        resp.raise_for_status()
        return resp.json()

    def calls(self, session_id: str) -> list[dict[str, Any]]:
        resp = self.http.get(f"{self.url}/sessions/{session_id}/calls", timeout=60)
        if resp.status_code == 404:
            return []
        resp.raise_for_status()
        return resp.json()["calls"]


@dataclass
class StageContext:
    settings: PipelineSettings
    store: PipelineStore
    gateway: GatewayClient
    enqueue: Callable[[str, str], None]  # (task name, session id)
    node: str = ""

    def __post_init__(self) -> None:
        self.node = self.node or node_name()
