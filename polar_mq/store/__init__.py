"""Everything that knows a Redis key or byte: key names and the store (`core`), the record codec
(`codec`), the wire client (`wire`), typed replies, pipeline state, groups, pause, histograms and
retention. `from polar_mq.store import Keys, ...` keeps working: names resolve to `core`."""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    module = importlib.import_module("polar_mq.store.core")

    try:
        return getattr(module, name)
    except AttributeError:
        raise AttributeError(f"module 'polar_mq.store' has no attribute {name!r}") from None
