"""Qwen Code (`agent.harness: qwen_code`): OpenAI Chat (default), Anthropic or Gemini.

Env ``OPENAI_*`` (or ``ANTHROPIC_*`` / ``GEMINI_*``) plus ``~/.qwen/settings.json`` with the auth
type and a ``modelProviders`` entry carrying the base URL. Facts verified against the pinned
version (shared/notes/harnesses.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from polar_mq.harnesses.base import (ANTHROPIC, DEFAULT_LIMITS, GEMINI, OPENAI_CHAT, CliLaunch, HarnessPackage,
                                     PathLike, check_api, harness_class, home_env, openai_v1, strip_slash, write_json)
from polar_mq.harnesses.limits import ModelLimits

PACKAGE = HarnessPackage("qwen_code", "@qwen-code/qwen-code", "0.15.10", "qwen")
APIS = (OPENAI_CHAT, ANTHROPIC, GEMINI)
_QWEN_AUTH = {OPENAI_CHAT: "openai", ANTHROPIC: "anthropic", GEMINI: "gemini"}


def configure(home: PathLike, base_urls: Mapping[str, str], key: str, model: str,
              instruction: str, *, api: str = OPENAI_CHAT, bin: str = "qwen",
              limits: ModelLimits = DEFAULT_LIMITS) -> CliLaunch:
    """Qwen Code: runs ``qwen -p TASK --yolo``.  Limits: the window as the provider entry's
    ``generationConfig.contextWindowSize`` (provider entries are sealed: a top-level
    ``model.generationConfig`` would not reach it), the output cap as
    ``QWEN_CODE_MAX_OUTPUT_TOKENS`` (not ``samplingParams.max_tokens``, which would make it send
    its sampling keys verbatim); with either set it also stops its 8k → 64k retry of a
    truncated answer.
    """
    check_api("qwen_code", api, APIS)
    home = Path(home)
    auth = _QWEN_AUTH[api]
    base = {OPENAI_CHAT: openai_v1(base_urls), ANTHROPIC: strip_slash(base_urls["anthropic"]),
            GEMINI: strip_slash(base_urls["gemini"])}[api]
    key_env = {OPENAI_CHAT: "OPENAI_API_KEY", ANTHROPIC: "ANTHROPIC_API_KEY",
               GEMINI: "GEMINI_API_KEY"}[api]
    settings = {
        "security": {"auth": {"selectedType": auth}, "folderTrust": {"enabled": False}},
        "model": {"name": model},
        "modelProviders": {auth: [{"id": model, "name": model, "baseUrl": base, "envKey": key_env,
                                   "generationConfig": {"contextWindowSize": limits.context_window}}]},
        "general": {"enableAutoUpdate": False, "disableAutoUpdate": True, "disableUpdateNag": True,
                    "checkpointing": {"enabled": False}},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False, "logPrompts": False},
        "ide": {"enabled": False},
    }
    files = [write_json(home / ".qwen" / "settings.json", settings)]
    env = home_env(home)
    env[key_env] = key
    if api == OPENAI_CHAT:
        env.update({"OPENAI_BASE_URL": base, "OPENAI_MODEL": model})
    elif api == ANTHROPIC:
        env.update({"ANTHROPIC_BASE_URL": base, "ANTHROPIC_MODEL": model})
    else:
        env.update({"GOOGLE_GEMINI_BASE_URL": base, "GEMINI_MODEL": model})
    env.update({"QWEN_CODE_NO_RELAUNCH": "true", "QWEN_SANDBOX": "false",
                "QWEN_CODE_MAX_OUTPUT_TOKENS": str(limits.max_output)})
    argv = [bin, "-p", instruction, "--yolo", "--auth-type", auth, "-m", model]
    return CliLaunch("qwen_code", api, argv, env, files)


HARNESS = harness_class("qwen_code", PACKAGE, APIS, configure, turns_settings=".qwen/settings.json")  # what registry.py loads for agent.harness "qwen_code"
