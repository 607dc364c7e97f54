"""Prometheus histograms kept in Redis, for facts observed by many processes on many hosts.

Stage workers (Celery processes anywhere) observe how long a session spent in each state and how
full the READY buffer was; the rollout API renders the sums at `/metrics`. One Redis hash per
histogram: a count per bucket (non-cumulative; cumulated when rendered), a sum and a count per
label value. Observations are HINCRBYs queued on the caller's pipeline, so they land atomically
with the state change they describe.

Tests: tests/store/test_session_cas.py, tests/gateway/test_metrics_live.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from polar_mq.store.core import Keys


@dataclass(frozen=True)
class HistogramSpec:
    name: str
    help: str
    label: str | None  # one label (e.g. "stage") or none
    buckets: tuple[float, ...]


STAGE_SECONDS = HistogramSpec(
    "polar_mq_stage_seconds", "seconds a session spent in a state (observed when it leaves it)", "stage",
    (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200))
READY_OCCUPANCY = HistogramSpec(
    "polar_mq_ready_occupancy", "sessions waiting in the READY buffer, observed at every hand-in and take-out",
    None, (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512))
ALL = (STAGE_SECONDS, READY_OCCUPANCY)


def _le(value: float) -> str:
    return repr(float(value))


def fields(spec: HistogramSpec, value: float, label_value: str = "") -> tuple[str, str, str, float]:
    """The hash fields one observation increments: (bucket, sum, count, value) — for scripts
    that observe inside their own atomic step (session_cas.py)."""
    bucket = next((b for b in spec.buckets if value <= b), math.inf)
    return f"{label_value}|{_le(bucket)}", f"{label_value}|sum", f"{label_value}|count", float(value)


def observe(pipe: Any, keys: Keys, spec: HistogramSpec, value: float, label_value: str = "") -> None:
    """Queue one observation on a Redis pipeline (or client)."""
    bucket, sum_field, count_field, value = fields(spec, value, label_value)
    key = keys.histogram(spec.name)
    pipe.hincrby(key, bucket, 1)
    pipe.hincrbyfloat(key, sum_field, value)
    pipe.hincrby(key, count_field, 1)


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def render(spec: HistogramSpec, raw: dict[bytes, bytes]) -> list[str]:
    """Prometheus text lines for one histogram from its Redis hash."""
    per_label: dict[str, dict[str, float]] = {}
    for field, value in raw.items():
        label_value, _, part = field.decode().rpartition("|")
        per_label.setdefault(label_value, {})[part] = float(value)
    lines = [f"# HELP {spec.name} {spec.help}", f"# TYPE {spec.name} histogram"]
    for label_value in sorted(per_label):
        data = per_label[label_value]
        base = f'{spec.label}="{label_value}"' if spec.label else ""
        running = 0.0
        for b in (*spec.buckets, math.inf):
            running += data.get(_le(b), 0.0)
            le = "+Inf" if b == math.inf else _fmt(b)
            labels = f"{base},le=\"{le}\"" if base else f'le="{le}"'
            lines.append(f"{spec.name}_bucket{{{labels}}} {_fmt(running)}")
        suffix = f"{{{base}}}" if base else ""
        lines.append(f"{spec.name}_sum{suffix} {_fmt(data.get('sum', 0.0))}")
        lines.append(f"{spec.name}_count{suffix} {_fmt(data.get('count', 0.0))}")
    return lines


def render_all(client: Any, keys: Keys) -> list[str]:
    with client.pipeline(transaction=False) as pipe:
        for spec in ALL:
            pipe.hgetall(keys.histogram(spec.name))
        raws = pipe.execute()
    out: list[str] = []
    for spec, raw in zip(ALL, raws):
        out.extend(render(spec, raw or {}))
    return out
