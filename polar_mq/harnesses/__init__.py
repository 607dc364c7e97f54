"""Harness shortcuts: how each agent CLI is configured and launched against a gateway session."""

from __future__ import annotations

from ..plugins import import_object
from .base import Harness, HarnessContext, Launch, session_env

_HARNESSES = {
    "shell": "polar_mq.harnesses.shell:ShellHarness",
    "claude_code": "polar_mq.harnesses.cli:ClaudeCodeHarness",
    "codex": "polar_mq.harnesses.cli:CodexHarness",
    "gemini_cli": "polar_mq.harnesses.cli:GeminiCliHarness",
    "qwen_code": "polar_mq.harnesses.cli:QwenCodeHarness",
    "opencode": "polar_mq.harnesses.cli:OpencodeHarness",
    "pi": "polar_mq.harnesses.cli:PiHarness",
}


def get_harness(name: str) -> Harness:
    target = _HARNESSES.get(name)
    if target is None:
        raise ValueError(f"harness {name!r} has no launcher yet (available: {', '.join(sorted(_HARNESSES))})")
    return import_object(target)()


__all__ = ["Harness", "HarnessContext", "Launch", "get_harness", "session_env"]
