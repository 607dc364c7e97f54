"""Runtimes: where a session's harness runs. `get_runtime(backend)` returns one by name."""

from __future__ import annotations

from .base import ExecResult, Runtime

_FACTORIES = {
    "local": "polar_mq.runtimes.local:LocalRuntime",
    "bwrap": "polar_mq.runtimes.bwrap:BwrapRuntime",
    "docker": "polar_mq.runtimes.docker:DockerRuntime",
    "apptainer": "polar_mq.runtimes.apptainer:ApptainerRuntime",
}


def get_runtime(backend: str) -> Runtime:
    import importlib

    target = _FACTORIES.get(backend)
    if target is None:
        raise ValueError(f"runtime backend {backend!r} is not available here "
                         f"(available: {', '.join(sorted(_FACTORIES))})")
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(module), cls)()


__all__ = ["ExecResult", "Runtime", "get_runtime"]
