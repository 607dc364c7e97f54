"""Harnesses: how each agent CLI is configured and launched against a gateway session.

One module per harness (claude_code, codex, gemini_cli, qwen_code, opencode, pi, shell), the
shared interface and CLI kit in base.py, the name → module registry in registry.py, the pinned
npm installs in install.py, the model limits a CLI is told in limits.py.
"""

from __future__ import annotations

from polar_mq.harnesses.base import CliLaunch, Harness, HarnessContext, Launch, session_env
from polar_mq.harnesses.registry import CLI_HARNESSES, build, get_harness, supported_apis

__all__ = ["CLI_HARNESSES", "CliLaunch", "Harness", "HarnessContext", "Launch", "build", "get_harness",
           "session_env", "supported_apis"]
