"""The trajectory viewer under `/ui/` (docs/viewer.md): routes, browser sign-in, views, and the
gateway session lookups it needs."""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    module = importlib.import_module("polar_mq.api.ui.routes")

    try:
        return getattr(module, name)
    except AttributeError:
        raise AttributeError(f"module 'polar_mq.api.ui' has no attribute {name!r}") from None
