"""Gemini CLI (`agent.harness: gemini_cli`): Google generateContent.

``~/.gemini/settings.json`` selects ``gemini-api-key`` auth (env alone fails with exit 41); env
``GOOGLE_GEMINI_BASE_URL``/``GEMINI_API_KEY`` point at the session. It has no context-window
setting, so the window reaches it through its compression threshold. Facts verified against the
pinned version (shared/notes/harnesses.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from polar_mq.harnesses.base import (DEFAULT_LIMITS, GEMINI, CliLaunch, HarnessPackage, PathLike, check_api,
                                     harness_class, home_env, strip_slash, write_json)
from polar_mq.harnesses.limits import ModelLimits

PACKAGE = HarnessPackage("gemini_cli", "@google/gemini-cli", "0.61.0", "gemini")
APIS = (GEMINI,)

#: Gemini CLI 0.61's own window table (core tokenLimits.ts): Gemma 4 256k, everything else 1M.
_GEMINI_CLI_WINDOWS = {"gemma-4-31b-it": 256_000, "gemma-4-26b-a4b-it": 256_000}
_GEMINI_CLI_DEFAULT_WINDOW = 1_048_576
_GEMINI_COMPRESS_AT = 0.5  # its default compressionThreshold: compress at half the window


def gemini_compression_threshold(model: str, limits: ModelLimits) -> float:
    """Gemini CLI has no window setting: it compresses when the last prompt passes
    `model.compressionThreshold` × its own table's window for the model name (1M for a name it
    does not know). This fraction makes that happen at half the *served* window (its default
    fraction), and never so late that the output limit no longer fits."""
    at = min(_GEMINI_COMPRESS_AT * limits.context_window, limits.context_window - limits.max_output)
    cli_window = _GEMINI_CLI_WINDOWS.get(model, _GEMINI_CLI_DEFAULT_WINDOW)
    return round(min(0.95, max(at, 1) / cli_window), 6)


def configure(home: PathLike, base_urls: Mapping[str, str], key: str, model: str,
              instruction: str, *, api: str = GEMINI, bin: str = "gemini",
              limits: ModelLimits = DEFAULT_LIMITS) -> CliLaunch:
    """Gemini CLI: settings.json + env; ``-m MODEL`` avoids the router/classifier side call.
    Runs ``gemini -p TASK --yolo -m MODEL``.  Limits: the output cap as a
    ``modelConfigs.customOverrides`` entry for the model (``maxOutputTokens``), the window through
    ``model.compressionThreshold`` (gemini_compression_threshold).
    """
    check_api("gemini_cli", api, APIS)
    home = Path(home)
    settings = {
        "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
        "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False,
                    "disableAutoUpdate": True, "disableUpdateNag": True,
                    "checkpointing": {"enabled": False}},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False, "logPrompts": False},
        "model": {"name": model, "compressionThreshold": gemini_compression_threshold(model, limits)},
        "modelConfigs": {"customOverrides": [
            {"match": {"model": model},
             "modelConfig": {"generateContentConfig": {"maxOutputTokens": limits.max_output}}}]},
        "ide": {"enabled": False},
    }
    files = [write_json(home / ".gemini" / "settings.json", settings)]
    env = home_env(home)
    env.update({
        "GEMINI_API_KEY": key,
        "GOOGLE_GEMINI_BASE_URL": strip_slash(base_urls["gemini"]),
        "GEMINI_MODEL": model,
        "GEMINI_CLI_TRUST_WORKSPACE": "true",
        "GEMINI_CLI_NO_RELAUNCH": "true",
        "GEMINI_SANDBOX": "false",
    })
    argv = [bin, "-p", instruction, "--yolo", "-m", model]
    return CliLaunch("gemini_cli", api, argv, env, files)


HARNESS = harness_class("gemini_cli", PACKAGE, APIS, configure, turns_settings=".gemini/settings.json")  # what registry.py loads for agent.harness "gemini_cli"
