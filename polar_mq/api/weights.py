"""Drive vLLM's RL API on every upstream that has it (vLLM 0.32 `entrypoints/rl/online`, served
when vLLM runs with `VLLM_SERVER_DEV_MODE=1`): `POST /pause?mode=abort|wait|keep`, `POST /resume`,
`POST /update_weight_version {"new_version"}`, `GET /weight_info` → `{"weight_version"}`,
`GET /is_paused` → `{"is_paused"}`. An upstream without it answers 404: it is skipped and
reported `rl_api: false` (the gateway's own pause still holds every generation).

The upstream URLs are the ones the live gateways registered with their heartbeats. What each
upstream last reported is kept in Redis (`Keys.upstream_weights`) for `GET /v1/admin/status`.

Tests: tests/gateway/test_pause.py; tests/vllm/test_rl_vllm.py against real vLLM.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import redis
import requests

from polar_mq.store import replies
from polar_mq.store.core import Keys

TIMEOUT = 10.0
PAUSE_TIMEOUT = 120.0  # mode=wait returns when vLLM's own in-flight requests finished


def _root(url: str) -> str:
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def _call(method: str, url: str, timeout: float = TIMEOUT, **kwargs: Any) -> tuple[int, Any]:
    try:
        resp = requests.request(method, url, timeout=timeout, **kwargs)
    except requests.RequestException as exc:
        return 0, f"{type(exc).__name__}: {exc}"
    try:
        return resp.status_code, resp.json()
    except ValueError:
        return resp.status_code, resp.text[:300]


def _one(root: str, steps: list[tuple[str, str, dict[str, Any]]]) -> dict[str, Any]:
    out: dict[str, Any] = {"rl_api": True}
    for method, path, kwargs in steps:
        status, body = _call(method, root + path, **kwargs)
        if status == 404:
            return {"rl_api": False}
        if status != 200:
            out["error"] = f"{method} {path}: {status or 'unreachable'} {body}"
            return out
    status, info = _call("GET", root + "/weight_info")
    if status == 200 and isinstance(info, dict):
        out["weight_version"] = info.get("weight_version")
    status, paused = _call("GET", root + "/is_paused")
    if status == 200 and isinstance(paused, dict):
        out["is_paused"] = paused.get("is_paused")
    return out


def _all(urls: list[str], steps: Callable[[str], list[tuple[str, str, dict[str, Any]]]],
         r: redis.Redis, keys: Keys) -> dict[str, Any]:
    if not urls:
        return {}
    roots = [_root(u) for u in urls]
    with ThreadPoolExecutor(max_workers=min(32, len(roots))) as pool:
        results = dict(zip(roots, pool.map(lambda root: _one(root, steps(root)), roots)))
    now = time.time()
    with r.pipeline(transaction=False) as pipe:
        for root, result in results.items():
            pipe.hset(keys.upstream_weights(), root, json.dumps({**result, "at": now}))
        pipe.execute()
    return results


def pause_all(urls: list[str], mode: str, r: redis.Redis, keys: Keys) -> dict[str, Any]:
    return _all(urls, lambda root: [("POST", "/pause", {"params": {"mode": mode}, "timeout": PAUSE_TIMEOUT})],
                r, keys)


def resume_all(urls: list[str], version: int | None, r: redis.Redis, keys: Keys) -> dict[str, Any]:
    def steps(root: str) -> list[tuple[str, str, dict[str, Any]]]:
        out = []
        if version is not None:
            out.append(("POST", "/update_weight_version", {"json": {"new_version": str(version)}}))
        out.append(("POST", "/resume", {}))
        return out

    return _all(urls, steps, r, keys)


def recorded(r: redis.Redis, keys: Keys) -> dict[str, Any]:
    return {k: json.loads(v) for k, v in replies.text_map(r.hgetall(keys.upstream_weights())).items()}
