"""What the stand-in generated, and which generations were aborted half-way.

vLLM stops a streamed generation when its client closes the connection, and any generation
whose id `POST /abort_requests` names (dev mode). The stand-in does the same (it stops sampling at
once) and counts it, so tests can check that the gateway really aborts
upstream work nobody wants: `GET /metrics` has vLLM's `vllm:request_success_total` series by
`finished_reason` (stop, length, abort...) plus `vllm:num_requests_running` and
`vllm:generation_tokens_total`; `GET /polar/generations` (a stand-in extension, not a vLLM
endpoint) lists the aborted generations with how many of their tokens were sent, and the sampling
parameters of the latest requests as the server received them.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from typing import Any

FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")  # vLLM's FinishReason strings
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "max_tokens", "max_completion_tokens", "seed", "stop")


class GenerationLog:
    def __init__(self, keep: int = 256):
        self._lock = threading.Lock()
        self._running: dict[str, dict[str, Any]] = {}
        self._finished: Counter[str] = Counter()
        self._tokens = 0
        self._aborted: deque[dict[str, Any]] = deque(maxlen=keep)
        self._recent: deque[dict[str, Any]] = deque(maxlen=keep)
        self._stops: dict[str, threading.Event] = {}

    def start(self, request_id: str, planned_tokens: int, body: dict[str, Any] | None = None) -> threading.Event:
        """Register a running generation; the event is set when it is aborted by id (`abort`)."""
        params = {k: (body or {}).get(k) for k in SAMPLING_FIELDS if (body or {}).get(k) is not None}
        stop = threading.Event()
        with self._lock:
            self._running[request_id] = {"id": request_id, "planned_tokens": planned_tokens,
                                         "sent_tokens": 0, "started_at": time.time(), "params": params}
            self._recent.append(self._running[request_id])
            self._stops[request_id] = stop
        return stop

    def abort(self, request_ids: list[str]) -> None:
        """vLLM's `/abort_requests`: stop the running generations with these ids (an unknown id
        is ignored); an empty list stops every one."""
        with self._lock:
            ids = list(self._stops) if not request_ids else [i for i in request_ids if i in self._stops]
            stops = [self._stops[i] for i in ids]
        for stop in stops:
            stop.set()

    def token(self, request_id: str, n: int = 1) -> None:
        with self._lock:
            gen = self._running.get(request_id)
            if gen is not None:
                gen["sent_tokens"] += n
                self._tokens += n

    def finish(self, request_id: str, reason: str) -> None:
        with self._lock:
            gen = self._running.pop(request_id, None)
            self._stops.pop(request_id, None)
            if gen is None:
                return
            self._finished[reason if reason in FINISH_REASONS else "stop"] += 1
            if reason == "abort":
                self._aborted.append({**gen, "aborted_at": time.time()})

    def whole(self, request_id: str, tokens: int, reason: str, body: dict[str, Any] | None = None) -> None:
        """A generation answered in one piece (not streamed)."""
        self.start(request_id, tokens, body)
        with self._lock:
            self._running[request_id]["sent_tokens"] = tokens
            self._tokens += tokens
        self.finish(request_id, reason)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"running": len(self._running), "finished": dict(self._finished),
                    "generation_tokens": self._tokens, "aborted": [dict(g) for g in self._aborted],
                    "recent": [dict(g) for g in self._recent]}

    def prometheus(self, model_name: str) -> str:
        snap = self.snapshot()
        labels = f'engine="0",model_name="{model_name}"'
        lines = ["# HELP vllm:num_requests_running Number of requests in model execution batches.",
                 "# TYPE vllm:num_requests_running gauge",
                 f"vllm:num_requests_running{{{labels}}} {float(snap['running'])}",
                 "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
                 "# TYPE vllm:generation_tokens_total counter",
                 f"vllm:generation_tokens_total{{{labels}}} {float(snap['generation_tokens'])}",
                 "# HELP vllm:request_success_total Count of successfully processed requests.",
                 "# TYPE vllm:request_success_total counter"]
        for reason in FINISH_REASONS:
            lines.append(f'vllm:request_success_total{{{labels},finished_reason="{reason}"}} '
                         f"{float(snap['finished'].get(reason, 0))}")
        return "\n".join(lines) + "\n"
