"""Runtimes: where a session's harness runs. `get_runtime(backend)` returns one by name."""

from __future__ import annotations

from ..plugins import import_object
from .base import ExecResult, Runtime

_FACTORIES = {
    "local": "polar_mq.runtimes.local:LocalRuntime",
    "bwrap": "polar_mq.runtimes.bwrap:BwrapRuntime",
    "docker": "polar_mq.runtimes.docker:DockerRuntime",
    "apptainer": "polar_mq.runtimes.apptainer:ApptainerRuntime",
}


def get_runtime(backend: str) -> Runtime:
    target = _FACTORIES.get(backend)
    if target is None:
        raise ValueError(f"runtime backend {backend!r} is not available here "
                         f"(available: {', '.join(sorted(_FACTORIES))})")
    return import_object(target)()


__all__ = ["ExecResult", "Runtime", "get_runtime"]
