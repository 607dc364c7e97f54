"""pi (`agent.harness: pi`): any of the four wire APIs, named pi's way.

``~/.pi/agent/models.json`` holds one provider (``baseUrl``, ``api``, literal ``apiKey``). Facts
verified against the pinned version (shared/notes/harnesses.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from polar_mq.harnesses.base import (ANTHROPIC, DEFAULT_LIMITS, GEMINI, OPENAI_CHAT, OPENAI_RESPONSES, PROVIDER_NAME,
                                     CliLaunch, HarnessPackage, PathLike, check_api, harness_class, home_env, openai_v1,
                                     strip_slash, write_json)
from polar_mq.harnesses.limits import ModelLimits

PACKAGE = HarnessPackage("pi", "@mariozechner/pi-coding-agent", "0.73.1", "pi")
APIS = (OPENAI_CHAT, OPENAI_RESPONSES, ANTHROPIC, GEMINI)
# Our API names → pi's (``api`` accepts either).
PI_APIS = {
    OPENAI_CHAT: "openai-completions",
    OPENAI_RESPONSES: "openai-responses",
    ANTHROPIC: "anthropic-messages",
    GEMINI: "google-generative-ai",
}


def configure(home: PathLike, base_urls: Mapping[str, str], key: str, model: str,
              instruction: str, *, api: str = OPENAI_CHAT, bin: str = "pi",
              limits: ModelLimits = DEFAULT_LIMITS) -> CliLaunch:
    """pi: ``api`` one of ``openai-completions``/``openai-responses``/``anthropic-messages``/
    ``google-generative-ai`` in its config.  Runs ``pi -p --no-session --model polar/MODEL TASK``.
    """
    api = {v: k for k, v in PI_APIS.items()}.get(api, api)
    check_api("pi", api, tuple(PI_APIS))
    home = Path(home)
    base = {
        OPENAI_CHAT: openai_v1(base_urls),
        OPENAI_RESPONSES: openai_v1(base_urls),
        ANTHROPIC: strip_slash(base_urls["anthropic"]),
        GEMINI: strip_slash(base_urls["gemini"]) + "/v1beta",
    }[api]
    agent_dir = home / ".pi" / "agent"
    provider = {
        "baseUrl": base,
        "api": PI_APIS[api],
        "apiKey": key,
        "models": [{"id": model, "name": model, "reasoning": False, "input": ["text"],
                    "contextWindow": limits.context_window, "maxTokens": limits.max_output}],
    }
    files = [
        write_json(agent_dir / "models.json", {"providers": {PROVIDER_NAME: provider}}),
        write_json(agent_dir / "settings.json", {
            "defaultProvider": PROVIDER_NAME, "defaultModel": model, "quietStartup": True,
            "collapseChangelog": True,
        }),
    ]
    env = home_env(home)
    env.update({"PI_CODING_AGENT_DIR": str(agent_dir), "PI_OFFLINE": "1", "PI_TELEMETRY": "0",
                "PI_SKIP_VERSION_CHECK": "1"})
    argv = [bin, "-p", "--no-session", "--model", f"{PROVIDER_NAME}/{model}", instruction]
    return CliLaunch("pi", api, argv, env, files)


HARNESS = harness_class("pi", PACKAGE, APIS, configure)  # what registry.py loads for agent.harness "pi"
