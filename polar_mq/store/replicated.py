"""Writes that must survive a failover wait for a replica (`WAIT 1 <ms>`) on a Sentinel-managed
primary (redis_url.py); on a single Redis nothing changes.

WAIT counts the replicas that acknowledged *this connection's* last write, so it goes down the same
connection as the write: after a script (session state changes: session_cas.py; group acks:
group_queue.py) in one non-transactional pipeline, after a gateway record's EXEC in the same send
(redis_wire.py). The wait is bounded (`POLAR_REDIS_WAIT_MS`, default 1000; 0 turns it off): with
no replica reachable the write stands on the primary alone after that long, and is logged — the
run goes on rather than stalls. What a failover can still lose: docs/deployment.md "Sentinel"
(tests/store/test_sentinel.py guards the no-loss case).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Sequence

import redis
from redis.exceptions import NoScriptError

log = logging.getLogger("polar_mq.store.replicated")


def wait_ms() -> int:
    try:
        return max(0, int(os.environ.get("POLAR_REDIS_WAIT_MS", "1000")))
    except ValueError:
        return 1000


def wait_command(r: Any) -> tuple[str, int, int] | None:
    """("WAIT", 1, ms) for a client on a Sentinel-managed primary, else None."""
    from polar_mq.store.redis_url import uses_sentinel

    ms = wait_ms()
    return ("WAIT", 1, ms) if ms and uses_sentinel(r) else None


def acked(count: Any, what: str) -> None:
    if isinstance(count, int) and count < 1:
        log.warning("%s: no replica confirmed it within %d ms; a failover now could lose it", what, wait_ms())


def run_script(r: redis.Redis, script: Any, keys: Sequence[Any], args: Sequence[Any], what: str) -> Any:
    """`script(keys=keys, args=args)`, then (Sentinel mode) WAIT on the same connection."""
    wait = wait_command(r)
    if wait is None:
        return script(keys=keys, args=args)
    for _ in range(2):
        with r.pipeline(transaction=False) as pipe:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
            pipe.execute_command(*wait)
            result, count = pipe.execute(raise_on_error=False)
        if isinstance(result, NoScriptError):  # nothing ran: load it (a new primary) and again
            r.script_load(script.script)
            continue
        if isinstance(result, Exception):
            raise result
        acked(count, what)
        return result
    raise NoScriptError(f"script {script.sha} could not be loaded")
