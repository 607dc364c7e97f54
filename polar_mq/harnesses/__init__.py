"""Harness shortcuts: how each agent CLI is configured and launched against a gateway session."""

from __future__ import annotations

import importlib

from .base import Harness, HarnessContext, Launch, session_env

_HARNESSES = {
    "shell": "polar_mq.harnesses.shell:ShellHarness",
}


def get_harness(name: str) -> Harness:
    target = _HARNESSES.get(name)
    if target is None:
        raise ValueError(f"harness {name!r} has no launcher yet (available: {', '.join(sorted(_HARNESSES))})")
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(module), cls)()


__all__ = ["Harness", "HarnessContext", "Launch", "get_harness", "session_env"]
