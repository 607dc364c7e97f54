"""What a stage needs: settings, the pipeline store, the gateway and a way to enqueue stages.

Tests: tests/pipeline/test_dispatch_paths.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import time

import requests

from polar_mq import sampling as sampling_policy
from polar_mq.tasks.app.causes import gateway_failure
from polar_mq.merge.records import as_record
from polar_mq.model import CaptureRecord
from polar_mq.store.pipeline import PipelineStore, node_name
from polar_mq.settings import PipelineSettings
from polar_mq.store.core import GatewayStore


MODEL_LEN_MAX_AGE = 60.0
SHARED_MAX_AGE = 60.0  # how long a check that the gateway shares our Redis is trusted


class GatewayClient:
    """The stages' view of the gateway: its HTTP resources, or the same records in Redis.

    Registering a session, waiting for its calls to finish and reading them are three HTTP
    round trips per session, and at dispatch rates they cost more CPU (in the gateway and in the
    client) than the rest of a no-op session's stages together (bench/bench_dispatch.py).
    The gateway keeps these records in Redis (polar_mq/store/core.py GatewayStore); when
    `direct` (a GatewayStore on the worker's Redis) is given and the gateway is *seen* to use that
    same Redis, the client reads and writes them there itself, with the gateway's own code.

    Seen, not assumed: a session this process created or read over HTTP is looked up in our
    Redis, and only if it is there with the same key (a random 24-byte secret) does the client
    go direct, for SHARED_MAX_AGE seconds before it checks again over HTTP. The base URLs a
    harness gets come from that same HTTP answer (the gateway's --public-url), so a gateway on
    another host, another Redis or another key prefix keeps the HTTP path unchanged.
    """

    def __init__(self, url: str, token: str | None = None, direct: GatewayStore | None = None):
        self.url = url.rstrip("/")
        self.http = requests.Session()
        # requests scans the environment (proxies, netrc) on every call unless told not to: do it
        # once for the one URL this client talks to.
        self.http.proxies = requests.utils.get_environ_proxies(self.url)
        self.http.trust_env = False
        # One client serves every slot of a threads pool: keep a connection per concurrent caller
        # rather than discarding (and re-opening) past urllib3's default of 10.
        adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=64)
        self.http.mount("http://", adapter)
        self.http.mount("https://", adapter)
        self.direct = direct
        self._shared: tuple[float, str | None] | None = None  # (checked at, base URL root or None)
        self._max_model_len: tuple[float, int | None] | None = None
        if token:
            self.http.headers["Authorization"] = f"Bearer {token}"

    # --- does the gateway share our Redis? -------------------------------------------------------
    def shared_root(self) -> str | None:
        """The gateway's base-URL root (`<public url>`) while it is known to share our Redis."""
        if self.direct is None or self._shared is None:
            return None
        checked, root = self._shared
        return root if time.monotonic() - checked < SHARED_MAX_AGE else None

    def _check_shared(self, answer: dict[str, Any]) -> None:
        """After an HTTP answer about a session (its id, key, base_urls): is that session in our
        Redis with the same key? Then the gateway reads and writes the records we would."""
        if self.direct is None:
            return
        root: str | None = None
        key, base = answer.get("key"), (answer.get("base_urls") or {}).get("anthropic", "")
        try:
            mine = self.direct.get_session(str(answer.get("session_id")))
        except Exception:
            mine = None
        suffix = f"/s/{key}"
        if key and mine is not None and mine.key == key and base.endswith(suffix):
            root = base[: -len(suffix)]
        self._shared = (time.monotonic(), root)

    @staticmethod
    def base_urls(root: str, key: str) -> dict[str, str]:
        """The harness base URLs of session key `key` (the gateway's own layout, core.base_urls)."""
        base = f"{root}/s/{key}"
        return {"anthropic": base, "openai": f"{base}/v1", "gemini": base}

    def create_session(self, session_id: str, task_id: str, metadata: dict[str, Any],
                       sampling: dict[str, Any] | None = None) -> dict[str, Any]:
        root = self.shared_root()
        if root is not None and self.direct is not None:
            policy = sampling_policy.validate(sampling, "sampling")  # what the gateway's POST checks
            session, _ = self.direct.create_session(session_id, task_id, metadata, policy)
            return {"session_id": session.session_id, "key": session.key,
                    "base_urls": self.base_urls(root, session.key)}
        body: dict[str, Any] = {"session_id": session_id, "task_id": task_id, "metadata": metadata}
        if sampling:
            body["sampling"] = sampling
        try:  # the session's error names the gateway and why (causes.py)
            resp = self.http.post(f"{self.url}/sessions", json=body, timeout=30)
            resp.raise_for_status()
        except requests.RequestException as exc:
            raise gateway_failure(self.url, exc) from exc
        answer = resp.json()
        self._check_shared(answer)
        return answer

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
            n = self._inflight(session_id)
            if n == 0 or time.monotonic() >= deadline:
                return n
            time.sleep(0.2)

    def idle_calls(self, session_id: str, timeout: float) -> tuple[int, list[CaptureRecord]]:
        """`wait_idle` then `calls`: (calls still in flight when the wait ended, the recorded
        calls). Direct, the in-flight count and the records come in one round trip per look."""
        if self.shared_root() is not None and self.direct is not None:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    n, calls = self.direct.inflight_and_calls(session_id)
                except Exception:  # Redis unreachable: the two steps below, one by one
                    break
                if n == 0 or time.monotonic() >= deadline:
                    return n, [as_record(call, session_id) for call in calls]
                time.sleep(0.2)
        return self.wait_idle(session_id, timeout), self.calls(session_id)

    def _inflight(self, session_id: str) -> int:
        if self.shared_root() is not None and self.direct is not None:
            try:
                return self.direct.inflight_calls(session_id)
            except Exception:  # Redis unreachable: as an unreachable gateway below
                return 0
        try:
            resp = self.http.get(f"{self.url}/sessions/{session_id}", timeout=10)
            answer = resp.json() if resp.ok else {}
        except (requests.RequestException, ValueError):
            return 0
        self._check_shared(answer)
        return int(answer.get("inflight_calls") or 0)

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
        if self.shared_root() is not None and self.direct is not None:
            return [as_record(call, session_id) for call in self.direct.calls(session_id)]
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
