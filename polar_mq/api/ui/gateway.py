"""What the viewer reads from the gateway, over HTTP only (never through its internals).

The gateway has the captured calls of a session (a live trajectory while it runs) and knows the
upstream's tokenizer: `POST /tokens/text` turns recorded ids into their text. A gateway that is
down or older only costs the page those parts (the answers say why); never a 5xx.
"""

from __future__ import annotations

from typing import Any, Iterable

import requests


class GatewayUnavailable(Exception):
    """The gateway did not answer usefully; the message says what happened."""


class GatewayReader:
    def __init__(self, url: str, token: str | None = None, timeout: float = 30.0):
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.http = requests.Session()
        if token:
            self.http.headers["Authorization"] = f"Bearer {token}"

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            resp = self.http.request(method, f"{self.url}{path}", timeout=self.timeout, **kwargs)
        except requests.RequestException as exc:
            raise GatewayUnavailable(f"gateway {self.url} unreachable: {exc}") from exc
        if resp.status_code == 404:
            return None
        if not resp.ok:
            try:
                detail = resp.json().get("detail") or resp.text
            except ValueError:
                detail = resp.text
            raise GatewayUnavailable(f"gateway answered {resp.status_code} on {path}: {str(detail)[:300]}")
        try:
            return resp.json()
        except ValueError as exc:
            raise GatewayUnavailable(f"gateway sent no JSON on {path}") from exc

    def calls(self, gateway_session_id: str) -> list[dict[str, Any]]:
        data = self._json("GET", f"/sessions/{gateway_session_id}/calls")
        return list((data or {}).get("calls") or [])

    def trajectory(self, gateway_session_id: str, builder: str) -> dict[str, Any] | None:
        return self._json("GET", f"/sessions/{gateway_session_id}/trajectory", params={"builder": builder})

    def token_texts(self, ids: Iterable[int]) -> tuple[str | None, dict[str, str | None]]:
        data = self._json("POST", "/tokens/text", json={"ids": sorted(set(ids))})
        if data is None:
            raise GatewayUnavailable("this gateway has no /tokens/text (an older version)")
        return data.get("model"), dict(data.get("texts") or {})
