"""The gateway's side of vLLM: the upstream pool (`pool`: affinity, health, retries), the lean
HTTP/1.1 client (`http11`) and the pure vLLM wire codec (`vllm_wire`)."""

from __future__ import annotations

from polar_mq import _forward

__getattr__ = _forward(__name__, "polar_mq.proxy_app.upstream.pool")
