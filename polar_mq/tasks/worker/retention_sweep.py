"""The janitor's retention pass: storage that cleans itself without `polar-mq gc`.

Every `POLAR_RETENTION_SWEEP_SECONDS` (default 300; 0: never) one worker cluster-wide (a Redis
lock held for the interval) runs `store.retention.collect`: finished tasks nobody exported or
acked, finished longer than `POLAR_RETENTION_SECONDS` ago, and orphan gateway sessions idle that
long are deleted with every key they own; nothing of an unfinished task or of a session in use is
touched. Counted in /metrics: `polar_mq_janitor_collected_tasks_total`,
`polar_mq_janitor_collected_sessions_total`, `polar_mq_janitor_collected_keys_total`.
Guarded by tests/pipeline/test_janitor_retention.py.
"""

from __future__ import annotations

import logging

import redis

from polar_mq.store import retention
from polar_mq.store.core import connect
from polar_mq.tasks.app.context import StageContext

log = logging.getLogger("polar_mq.janitor")

_gateway_clients: dict[str, redis.Redis] = {}


def gateway_redis(ctx: StageContext) -> redis.Redis | None:
    """The gateway's own Redis (POLAR_GATEWAY_REDIS_URL), or None when it shares the pipeline's."""
    url = ctx.settings.gateway_redis_url
    if not url or url == ctx.settings.redis_url:
        return None
    if url not in _gateway_clients:
        _gateway_clients[url] = connect(url, ride_out_outages=10.0)
    return _gateway_clients[url]


def run_pass(ctx: StageContext) -> retention.Collected | None:
    """One pass if this worker wins the cluster-wide lock for the interval (else None)."""
    interval, keep = ctx.settings.retention_sweep_interval, ctx.settings.retention_seconds
    if interval <= 0 or keep <= 0:
        return None
    lock = ctx.store.keys.janitor_lock() + ":retention"
    if not ctx.store.r.set(lock, ctx.node, nx=True, px=max(1, int(interval * 1000))):
        return None
    got = retention.collect(ctx.store.r, ctx.store.keys, retention=keep, gw=gateway_redis(ctx),
                            sessions_dir=ctx.settings.sessions_dir)
    for name, amount in zip(retention.COUNTERS, (len(got.tasks), len(got.sessions), got.keys)):
        if amount:
            ctx.store.incr(name, amount)
    if got.tasks or got.sessions:
        log.info("retention: collected %d unexported task(s), %d orphan gateway session(s), %d key(s)",
                 len(got.tasks), len(got.sessions), got.keys)
    return got
