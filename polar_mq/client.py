"""A small Python client for the rollout API.

    from polar_mq.client import Client
    c = Client()   # $POLAR_API_URL, else http://127.0.0.1:8700; token: $POLAR_API_TOKEN, else $POLAR_HOME/token
    task = c.submit("task.yaml")       # or a dict
    final = c.wait(task["task_id"], timeout=600)
    trajectories = c.results(task["task_id"], status="COMPLETED", min_reward=0.5)["trajectories"]

Errors come back as `ApiError` carrying the problem details the API answered.

Tests: tests/cli/test_client_cli.py, tests/api/test_groups.py.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import requests

from polar_mq import model

if TYPE_CHECKING:  # pragma: no cover
    from polar_mq.rl.group_stream import GroupStream

DEFAULT_URL = "http://127.0.0.1:8700"
TERMINAL_STATES = frozenset(model.TERMINAL_STATES)


class ApiError(Exception):
    """An error answer of the API (problem details) or an unreachable API (status 0)."""

    def __init__(self, status: int, title: str, detail: str, *, field: str | None = None,
                 problem: dict[str, Any] | None = None):
        self.status = status
        self.title = title
        self.detail = detail
        self.field = field
        self.problem = problem or {}
        where = f" [{field}]" if field else ""
        super().__init__(f"{status} {title}{where}: {detail}" if status else f"{title}: {detail}")


def default_url() -> str:
    return (os.environ.get("POLAR_API_URL") or DEFAULT_URL).rstrip("/")


def _content_type(path: Path, text: str) -> str:
    suffix = path.suffix.lower()
    if suffix in (".yaml", ".yml"):
        return "application/yaml"
    if suffix == ".json":
        return "application/json"
    try:
        json.loads(text)
        return "application/json"
    except ValueError:
        return "application/yaml"


class Client:
    def __init__(self, url: str | None = None, token: str | None = None, *, timeout: float = 30.0,
                 session: requests.Session | None = None):
        self.url = (url or default_url()).rstrip("/")
        from polar_mq.auth import client_token

        self.token = client_token(token)
        self.timeout = timeout
        self.http = session or requests.Session()

    # --- plumbing -------------------------------------------------------------------------------
    def _send(self, method: str, path: str, *, timeout: float | None = None, **kwargs: Any) -> requests.Response:
        """One request; an error answer becomes ApiError with the problem details."""
        headers = dict(kwargs.pop("headers", None) or {})
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            resp = self.http.request(method, self.url + path, headers=headers,
                                     timeout=timeout or self.timeout, **kwargs)
        except requests.RequestException as exc:
            raise ApiError(0, "API unreachable", f"{method} {self.url}{path}: {exc}") from exc
        if resp.status_code >= 400:
            try:
                problem = resp.json()
            except ValueError:
                problem = {}
            if not isinstance(problem, dict):
                problem = {}
            raise ApiError(resp.status_code, problem.get("title") or resp.reason or "error",
                           problem.get("detail") or resp.text[:500], field=problem.get("field"),
                           problem=problem)
        return resp

    def _request(self, method: str, path: str, *, timeout: float | None = None, **kwargs: Any) -> Any:
        resp = self._send(method, path, timeout=timeout, **kwargs)
        if not resp.content:
            return None
        ctype = resp.headers.get("Content-Type", "")
        return resp.json() if "json" in ctype else resp.text

    # --- API ------------------------------------------------------------------------------------
    def submit(self, task: dict[str, Any] | str | os.PathLike[str], *,
               early_stop_min_usable_sessions: int | None = None,
               dispatch_priority: int | None = None) -> dict[str, Any]:
        """Submit a TaskRequest (a dict, or a path to a YAML/JSON file) → {"task_id", "session_ids"}.
        `early_stop_min_usable_sessions` / `dispatch_priority`, when given, are set on it."""
        over = {k: v for k, v in (("early_stop_min_usable_sessions", early_stop_min_usable_sessions),
                                  ("dispatch_priority", dispatch_priority)) if v is not None}
        if over and not isinstance(task, dict):
            import yaml

            loaded = yaml.safe_load(Path(task).read_text(encoding="utf-8"))
            if not isinstance(loaded, dict):  # the API says what is wrong with it
                return self._request("POST", "/v1/tasks", json=loaded)
            task = loaded
        if isinstance(task, dict):
            return self._request("POST", "/v1/tasks", json={**task, **over})
        path = Path(task)
        text = path.read_text(encoding="utf-8")
        return self._request("POST", "/v1/tasks", data=text.encode("utf-8"),
                             headers={"Content-Type": _content_type(path, text)})

    def submit_checked(self, task: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Submit a TaskRequest dict → (answer, created): created is False for an identical
        resubmit (the API's 200), True for a new task (202)."""
        resp = self._send("POST", "/v1/tasks", json=task)
        return resp.json(), resp.status_code == 202

    def status(self, task_id: str) -> dict[str, Any]:
        return self._request("GET", f"/v1/tasks/{task_id}")

    def tasks(self, limit: int = 50) -> list[dict[str, Any]]:
        return self._request("GET", "/v1/tasks", params={"limit": limit})["tasks"]

    def results(self, task_id: str, *, status: str | list[str] | None = None, min_reward: float | None = None,
                **params: Any) -> dict[str, Any]:
        query = {k: v for k, v in params.items() if v is not None}
        if status:
            query["status"] = status if isinstance(status, str) else ",".join(status)
        if min_reward is not None:
            query["min_reward"] = min_reward
        return self._request("GET", f"/v1/tasks/{task_id}/results", params=query, timeout=max(self.timeout, 120))

    def cancel(self, task_id: str) -> dict[str, Any]:
        return self._request("DELETE", f"/v1/tasks/{task_id}")

    def session(self, session_id: str) -> dict[str, Any]:
        return self._request("GET", f"/v1/sessions/{session_id}")

    def pause(self, wait: float | None = None, mode: str | None = None) -> dict[str, Any]:
        """Stop new generations cluster-wide and wait up to `wait` s for the ones in flight;
        `mode` (keep | wait | abort) is passed to vLLM upstreams that have the RL API."""
        params: dict[str, Any] = {} if wait is None else {"wait": wait}
        if mode:
            params["mode"] = mode
        return self._request("POST", "/v1/admin/pause", params=params,
                             timeout=(wait if wait is not None else 3600) + self.timeout)

    def resume(self, policy_version: int | None = None) -> dict[str, Any]:
        """Resume generation; with `policy_version`, every call from now on is stamped with it."""
        body = {} if policy_version is None else {"policy_version": policy_version}
        return self._request("POST", "/v1/admin/resume", json=body)

    def admin_status(self) -> dict[str, Any]:
        """Paused or not, in-flight generations per gateway, the current policy_version."""
        return self._request("GET", "/v1/admin/status")

    # --- groups for trainers --------------------------------------------------------------------
    def next_groups(self, limit: int = 1, wait: float = 0.0, lease: float = 300.0, *,
                    msgpack_body: bool = True) -> list[dict[str, Any]]:
        """Lease up to `limit` finished groups (plain dicts), waiting up to `wait` s for one. The
        answer travels as msgpack (the same object as the JSON answer, cheaper for token ids)."""
        params = {"limit": limit, "wait": wait, "lease": lease}
        headers = {"Accept": "application/msgpack"} if msgpack_body else {}
        resp = self._send("GET", "/v1/groups/next", params=params, headers=headers, timeout=wait + self.timeout)
        if resp.headers.get("Content-Type", "").startswith("application/msgpack"):
            import msgpack

            return msgpack.unpackb(resp.content, raw=False, strict_map_key=False)["groups"]
        return resp.json()["groups"]

    def ack_group(self, task_id: str, reason: str | None = None) -> dict[str, Any]:
        """Consume a group for good (`reason`: trained, stale, unusable, skipped; counted)."""
        return self._request("POST", f"/v1/groups/{task_id}/ack", json={"reason": reason} if reason else {})

    def group_stats(self) -> dict[str, Any]:
        return self._request("GET", "/v1/groups/stats")

    def groups(self, **options: Any) -> "GroupStream":
        """A streaming iterator of finished groups (`polar_mq.rl.group_stream.GroupStream`): batch,
        wait, lease, max_staleness, stale="drop"|"keep", policy_version, drop_unusable,
        drop_uniform_reward, advantages="mean_std"|"leave_one_out", auto_ack, max_groups,
        idle_timeout."""
        from polar_mq.rl.group_stream import GroupStream

        return GroupStream(self, **options)

    def health(self) -> dict[str, Any]:
        return self._request("GET", "/health")

    def overview(self) -> dict[str, Any]:
        """Stage pools, queues, READY occupancy, sessions by state (what `polar-mq top` shows)."""
        return self._request("GET", "/ui/api/overview")

    def wait(self, task_id: str, timeout: float | None = None, poll: float = 1.0,
             on_update: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Poll until every session is terminal; returns the final status. `on_update(status)` is
        called with the first status and whenever the counts change. Raises TimeoutError."""
        deadline = None if timeout is None else time.monotonic() + timeout
        last: Any = None
        while True:
            status = self.status(task_id)
            key = (status.get("counts"), status.get("state"))
            if on_update is not None and key != last:
                on_update(status)
            last = key
            if status.get("state") == "done":
                return status
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"task {task_id} not done after {timeout}s: {status.get('counts')}")
            sleep = poll if deadline is None else max(0.0, min(poll, deadline - time.monotonic()))
            time.sleep(sleep)
