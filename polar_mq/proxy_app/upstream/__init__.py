"""The gateway's side of vLLM: the upstream pool (`pool`: affinity, health, retries), the lean
HTTP/1.1 client (`http11`) and the pure vLLM wire codec (`vllm_wire`)."""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    module = importlib.import_module("polar_mq.proxy_app.upstream.pool")

    try:
        return getattr(module, name)
    except AttributeError:
        raise AttributeError(f"module 'polar_mq.proxy_app.upstream' has no attribute {name!r}") from None
