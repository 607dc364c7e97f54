"""Why a stage attempt failed, in one line a user can act on, kept until the session gives up.

A stage that raises leaves its session to the janitor, which retries it and, after
`max_attempts`, ends it as ERROR. Its `error` is the last attempt's cause, then "gave up after N
attempts (last in STATE on NODE)", e.g. "gateway unreachable at http://127.0.0.1:8600: connection
refused; gave up after 3 attempts (...)": the user sees why without the worker's log.
Guarded by tests/pipeline/test_give_up_cause.py.
"""

from __future__ import annotations

from typing import Any

import requests

CAUSE_TTL = 7 * 24 * 3600  # a cause outlives any retry schedule; the key then expires by itself
MAX_CHARS = 500


class GatewayUnreachable(RuntimeError):
    """The pipeline could not reach (or was refused by) the gateway it is configured with."""


def _root_reason(exc: BaseException) -> str:
    """'connection refused', 'timed out', 'name not known', ... from a requests error's chain."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError):
            return "connection refused"
        if isinstance(seen, TimeoutError):
            return "timed out"
        text = str(seen)
        if "Name or service not known" in text or "nodename nor servname" in text:
            return "host name not known"
        if "Connection refused" in text:
            return "connection refused"
        seen = seen.__cause__ or seen.__context__ or (seen.args[0] if seen.args and
                                                       isinstance(seen.args[0], BaseException) else None)
    if isinstance(exc, requests.Timeout):
        return "timed out"
    return str(exc)[:200]


def gateway_failure(url: str, exc: requests.RequestException) -> GatewayUnreachable:
    """The error a stage raises when its call to the gateway at `url` fails."""
    resp = getattr(exc, "response", None)
    if isinstance(exc, requests.HTTPError) and resp is not None:
        return GatewayUnreachable(f"gateway at {url} answered {resp.status_code}: "
                                  f"{(resp.text or '').strip()[:200]}")
    return GatewayUnreachable(f"gateway unreachable at {url}: {_root_reason(exc)}")


def describe(exc: BaseException) -> str:
    text = str(exc) if isinstance(exc, GatewayUnreachable) else f"{type(exc).__name__}: {exc}"
    return text[:MAX_CHARS]


def _key(store: Any, session_id: str) -> str:
    return f"{store.keys.prefix}:cause:{session_id}"


def remember(store: Any, session_id: str, attempt: int, exc: BaseException) -> None:
    """Keep `exc` as the cause of the session's attempt `attempt` (best effort: never masks the
    exception itself)."""
    try:
        store.r.set(_key(store, session_id), f"{attempt}\t{describe(exc)}", ex=CAUSE_TTL)
    except Exception:
        pass


def last(store: Any, session_id: str, attempt: int) -> str | None:
    """The cause recorded for attempt `attempt`; None when that attempt left none (its worker
    died, say): an earlier attempt's cause is not this one's."""
    try:
        value = store.r.get(_key(store, session_id))
    except Exception:
        return None
    if value is None:
        return None
    text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    recorded, _, cause = text.partition("\t")
    return cause if recorded == str(attempt) else None
