"""What every builder looks like, so that the registry can treat built-in and custom ones alike."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

from polar_mq.model import CaptureRecord, Trace


@dataclass
class BuildResult:
    """Traces plus the builder's own statistics (merged over the registry's common ones)."""

    traces: list[Trace]
    stats: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Builder(Protocol):
    """A builder is constructed with its (validated) config and turns records into traces.

    ``Config`` is an optional dataclass: when present the registry validates user config
    against it (unknown key or wrong type -> ValueError) and passes an instance to ``__init__``.
    ``build`` receives normalised `CaptureRecord`s in arbitrary order and may return a
    `BuildResult` or a plain list of traces.
    """

    name: ClassVar[str]

    def build(self, records: list[CaptureRecord]) -> BuildResult | list[Trace]: ...
