"""Context window and output limit a harness is told, from the model that really serves it.

A CLI that believes its model has a smaller window than it has compacts far too early: with a
long system prompt and a hard-coded 32k window, opencode compacted after every tool call and
looped until its budget ended. So the window is the served model's `max_model_len` (the
gateway reads it from the upstream's /v1/models); a task can override both numbers with
`agent.options.context_window` / `agent.options.max_output_tokens`. The output limit defaults to
the task's sampling cap (`agent.sampling.max_tokens`, which the gateway enforces anyway), else a
quarter of the window (at most 32k), so that window - output leaves room for the conversation.

Tests: tests/harnesses/test_harness_limits.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FALLBACK_WINDOW = 32768  # when neither the upstream nor the task says
MAX_DEFAULT_OUTPUT = 32768


@dataclass(frozen=True)
class ModelLimits:
    context_window: int
    max_output: int
    source: str  # "upstream" | "task" | "fallback": where the window came from


def _positive(options: dict[str, Any], name: str) -> int | None:
    value = options.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"agent.options.{name}: must be a positive integer, got {value!r}")
    return value


def resolve(max_model_len: int | None, options: dict[str, Any] | None = None,
            sampling: dict[str, Any] | None = None) -> ModelLimits:
    opts = options or {}
    window = _positive(opts, "context_window")
    source = "task"
    if window is None:
        window, source = (max_model_len, "upstream") if max_model_len else (FALLBACK_WINDOW, "fallback")
    output = _positive(opts, "max_output_tokens") or (sampling or {}).get("max_tokens") \
        or min(MAX_DEFAULT_OUTPUT, max(256, window // 4))
    if output >= window:
        output = max(1, window // 2)
    return ModelLimits(int(window), int(output), source)
