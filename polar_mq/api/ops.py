"""Operations endpoints: /health (public), /metrics (Prometheus text), /openapi.json."""

from __future__ import annotations

import re
from collections import Counter

import redis
from flask import Blueprint, Response, jsonify

from polar_mq import states
from polar_mq.store import histograms
from polar_mq.store import retention
from polar_mq.tasks.app.routing import QUEUES
from polar_mq.tasks.app import priority
from polar_mq.store.pause import PauseState
from polar_mq.api.context import ctx
from polar_mq.api.openapi import document
from polar_mq.api.problems import Problem

bp = Blueprint("ops", __name__)


def queue_lengths() -> dict[str, int]:
    return priority.depths(ctx().redis, QUEUES)  # every dispatch_priority level counted


@bp.get("/health")
def health() -> Response:
    c = ctx()
    try:
        c.redis.ping()
        queues = queue_lengths()
        paused = bool(c.redis.exists(c.keys.gateway_paused()))
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise Problem(503, f"redis unreachable: {exc}", kind="redis-unavailable", redis=False)
    return jsonify({"status": "ok", "redis": True, "queues": queues, "gateway_paused": paused,
                    "ready": len(c.store.ready_list()), "slots_held": len(c.store.slots_held())})


def _metric_name(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name).strip("_").lower()


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


@bp.get("/metrics")
def metrics() -> Response:
    c = ctx()
    lines: list[str] = []

    def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            lines.append(f"{name}{labels} {_fmt(value)}")

    counters = c.store.counters()
    for key in retention.COUNTERS:  # the janitor's collection, shown from 0
        counters.setdefault(key, 0.0)
    for key in sorted(counters):
        name = f"polar_mq_{_metric_name(key)}_total"
        metric(name, "counter", f"pipeline counter {key}", [("", counters[key])])

    active = c.store.get_sessions(c.store.active_sessions())
    by_state = Counter(r.state for r in active)
    metric("polar_mq_sessions_active", "gauge", "non-terminal sessions by state",
           [(f'{{state="{s}"}}', by_state.get(s, 0)) for s in states.ORDER])
    terminal = [(f'{{state="{s}"}}', counters.get(f"sessions_{s.lower()}", 0.0))
                for s in sorted(states.TERMINAL)]
    metric("polar_mq_sessions_finished_total", "counter", "sessions that reached a terminal state", terminal)

    metric("polar_mq_queue_length", "gauge", "messages waiting in a Celery stage queue",
           [(f'{{queue="{q}"}}', n) for q, n in queue_lengths().items()])
    metric("polar_mq_ready_buffer_length", "gauge", "sessions prepared and waiting for a run worker",
           [("", len(c.store.ready_list()))])
    metric("polar_mq_ready_slots_held", "gauge", "READY slots held (initializing or ready sessions)",
           [("", len(c.store.slots_held()))])
    metric("polar_mq_ready_capacity", "gauge", "READY buffer capacity",
           [("", c.store.ready_capacity(c.settings.ready_capacity))])
    drain = PauseState(c.redis, c.keys).drain()
    metric("polar_mq_gateway_inflight", "gauge", "generations in flight on live gateways",
           [("", drain.in_flight)])
    metric("polar_mq_gateways_live", "gauge", "gateway processes with a recent heartbeat",
           [("", len(drain.live_gateways))])
    groups = c.store.groups.stats()
    metric("polar_mq_groups", "gauge", "finished groups by queue state",
           [('{state="pending"}', groups["pending"]), ('{state="leased"}', groups["leased"])])
    metric("polar_mq_gateway_paused", "gauge", "1 when the gateway is paused",
           [("", 1 if c.redis.exists(c.keys.gateway_paused()) else 0)])
    mem = retention.memory(c.redis)
    metric("polar_mq_redis_memory_bytes", "gauge", "Redis memory (INFO memory): used, rss, peak, dataset, maxmemory",
           [(f'{{kind="{k.removeprefix("used_memory_") if k != "used_memory" else "used"}"}}', v)
            for k, v in mem.items()])
    if c.gateway_redis is not None:  # the gateway keeps its records in a Redis of its own
        metric("polar_mq_gateway_redis_memory_bytes", "gauge", "the gateway's own Redis (INFO memory)",
               [(f'{{kind="{k.removeprefix("used_memory_") if k != "used_memory" else "used"}"}}', v)
                for k, v in retention.memory(c.gateway_redis).items()])
    lines.extend(histograms.render_all(c.redis, c.keys))
    return Response("\n".join(lines) + "\n", mimetype="text/plain",
                    headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


@bp.get("/openapi.json")
def openapi() -> Response:
    return jsonify(document())
