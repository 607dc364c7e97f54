"""Choosing and running a builder by name, so a TaskRequest's ``builder: {strategy, config}``
maps to code in one place: built-ins by name, custom builders by ``module:Class``.

Tests: tests/merge/test_merge.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from polar_mq.merge.base import BuildResult
from polar_mq.merge.config import parse_config
from polar_mq.merge.lost import link_lost_calls
from polar_mq.merge.per_request import PerRequestBuilder
from polar_mq.merge.prefix_merging import PrefixMergingBuilder
from polar_mq.merge.records import as_record, prepare
from polar_mq.merge.stats import base_stats
from polar_mq.model import TERMINAL_STATES, CaptureRecord, SessionState, Trajectory
from polar_mq._io.plugins import import_object

_BUILDERS: dict[str, type] = {
    PerRequestBuilder.name: PerRequestBuilder,
    PrefixMergingBuilder.name: PrefixMergingBuilder,
}
STATUSES = TERMINAL_STATES


def register(name: str, cls: type) -> None:
    """Make ``cls`` available under ``name`` (e.g. from a plugin's import)."""
    if not callable(getattr(cls, "build", None)):
        raise TypeError(f"builder {name!r}: {cls!r} has no build() method")
    _BUILDERS[name] = cls


def available_builders() -> list[str]:
    return sorted(_BUILDERS)


def _load(name_or_path: str) -> type:
    if name_or_path in _BUILDERS:
        return _BUILDERS[name_or_path]
    if ":" not in name_or_path:
        raise ValueError(f"unknown builder {name_or_path!r}; use one of "
                         f"{', '.join(available_builders())} or 'module:Class'")
    try:
        obj = import_object(name_or_path)
    except ValueError as exc:
        raise ValueError(f"builder {name_or_path!r}: {exc}") from None
    if not isinstance(obj, type) or not callable(getattr(obj, "build", None)):
        raise ValueError(f"builder {name_or_path!r}: not a class with a build() method")
    return obj


def get_builder(name_or_path: str, config: Mapping[str, Any] | Any | None = None) -> Any:
    """An instance of the named builder with validated config (ValueError names a bad key)."""
    cls = _load(name_or_path)
    config_cls = getattr(cls, "Config", None)
    if config_cls is not None:
        return cls(parse_config(config_cls, config, builder=name_or_path))
    if config:
        return cls(dict(config))
    return cls()


def build(
    name_or_path: str,
    records: Iterable[CaptureRecord | Mapping[str, Any]],
    config: Mapping[str, Any] | None = None,
    *,
    session_id: str,
    task_id: str | None = None,
    status: str = SessionState.COMPLETED,
) -> Trajectory:
    """Records (objects or dicts, any order) -> Trajectory. A session that ended in ERROR or
    TIMEOUT still gets every trace its captured calls allow."""
    if status not in STATUSES:
        raise ValueError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
    builder = get_builder(name_or_path, config)
    recs = [as_record(r, session_id) for r in records]
    result = builder.build(recs)
    if not isinstance(result, BuildResult):
        result = BuildResult(list(result))
    stats = base_stats(prepare(recs), result.traces) if not _has_base(result.stats) else {}
    stats.update(result.stats)
    stats["traces"] = len(result.traces)
    lost = link_lost_calls(recs, result.traces)  # calls a dead gateway process took (merge/lost.py)
    if lost:
        stats["lost_calls"] = len(lost)
    return Trajectory(session_id=session_id, task_id=task_id, status=status,
                      builder=name_or_path, traces=result.traces, stats=stats,
                      metadata={"lost_calls": lost} if lost else {})


def _has_base(stats: Mapping[str, Any]) -> bool:
    return all(k in stats for k in ("calls", "traces", "delivered_fraction"))
