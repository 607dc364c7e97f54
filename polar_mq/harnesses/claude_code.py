"""Claude Code (`agent.harness: claude_code`): env only, Anthropic Messages.

``ANTHROPIC_BASE_URL``/``ANTHROPIC_API_KEY``/``ANTHROPIC_MODEL`` (and every model alias) point at
the session; runs ``claude -p TASK`` with the file/shell tools pre-approved. The non-essential
traffic flag stops the title side request, update checks and telemetry. Facts verified against the
pinned version (shared/notes/harnesses.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from polar_mq.harnesses.base import (ANTHROPIC, DEFAULT_LIMITS, CliLaunch, HarnessPackage, PathLike, check_api,
                                     harness_class, home_env, strip_slash, write_json)
from polar_mq.harnesses.limits import ModelLimits

PACKAGE = HarnessPackage("claude_code", "@anthropic-ai/claude-code", "2.1.197", "claude")
APIS = (ANTHROPIC,)


def configure(home: PathLike, base_urls: Mapping[str, str], key: str, model: str,
              instruction: str, *, api: str = ANTHROPIC, bin: str = "claude",
              limits: ModelLimits = DEFAULT_LIMITS) -> CliLaunch:
    """Claude Code: env only (``ANTHROPIC_BASE_URL``/``ANTHROPIC_API_KEY``/``ANTHROPIC_MODEL``).

    Runs ``claude -p TASK`` with the file/shell tools pre-approved.  Speaks Anthropic only; the
    output cap is ``CLAUDE_CODE_MAX_OUTPUT_TOKENS``.
    """
    check_api("claude_code", api, APIS)
    home = Path(home)
    # Skip the first-run onboarding screens (harmless in -p mode, needed for interactive use).
    files = [write_json(home / ".claude.json", {
        "hasCompletedOnboarding": True, "autoUpdates": False, "numStartups": 1,
        "hasAcknowledgedCostThreshold": True,
    })]
    env = home_env(home)
    env.update({
        "ANTHROPIC_BASE_URL": strip_slash(base_urls["anthropic"]),
        "ANTHROPIC_API_KEY": key,
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_SMALL_FAST_MODEL": model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_BUG_COMMAND": "1",
        "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
        "IS_SANDBOX": "1",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(limits.max_output),
    })
    argv = [bin, "-p", instruction, "--model", model,
            "--allowedTools", "Bash Write Edit Read Glob Grep", "--permission-mode", "acceptEdits"]
    return CliLaunch("claude_code", api, argv, env, files)


HARNESS = harness_class("claude_code", PACKAGE, APIS, configure, max_turns_flag="--max-turns")  # what registry.py loads for agent.harness "claude_code"
