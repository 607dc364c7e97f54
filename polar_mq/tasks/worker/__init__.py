"""What workers run: the stages (init -> READY -> run -> postrun), the janitor, recovery, leases,
fencing, the cancel watch and the worker entry point (`main`)."""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    module = importlib.import_module("polar_mq.tasks.worker.main")

    try:
        return getattr(module, name)
    except AttributeError:
        raise AttributeError(f"module 'polar_mq.tasks.worker' has no attribute {name!r}") from None
