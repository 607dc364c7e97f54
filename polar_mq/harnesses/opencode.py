"""opencode (`agent.harness: opencode`): any of the four wire APIs through one AI SDK provider.

``~/.config/opencode/opencode.json`` holds one provider whose ``options.baseURL`` points at the
session (without it nothing reaches the gateway). Facts verified against the pinned version
(shared/notes/harnesses.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from polar_mq.harnesses.base import (ALL_APIS, ANTHROPIC, DEFAULT_LIMITS, GEMINI, OPENAI_CHAT, OPENAI_RESPONSES,
                                     PROVIDER_NAME, CliLaunch, HarnessPackage, PathLike, check_api, harness_class,
                                     home_env, openai_v1, strip_slash, write_json)
from polar_mq.harnesses.limits import ModelLimits

PACKAGE = HarnessPackage("opencode", "opencode-ai", "1.18.33", "opencode")
APIS = (OPENAI_CHAT, OPENAI_RESPONSES, ANTHROPIC, GEMINI)


def configure(home: PathLike, base_urls: Mapping[str, str], key: str, model: str,
              instruction: str, *, api: str = OPENAI_CHAT, bin: str = "opencode",
              limits: ModelLimits = DEFAULT_LIMITS) -> CliLaunch:
    """opencode: ``openai_chat`` uses ``@ai-sdk/openai-compatible``; the other APIs use the AI SDK
    package of that provider. ``model`` and ``small_model`` are both set so the title side request
    goes to the gateway too. Runs ``opencode run --model polar/MODEL < HOME/.polar-instruction``
    (via ``sh -c``): given as an argument, ``opencode run`` would wrap the instruction in double
    quotes (it quotes every argv word containing a space), so it goes in on stdin from a file.
    """
    npm, base = {
        OPENAI_CHAT: ("@ai-sdk/openai-compatible", openai_v1(base_urls)),
        OPENAI_RESPONSES: ("@ai-sdk/openai", openai_v1(base_urls)),
        ANTHROPIC: ("@ai-sdk/anthropic", strip_slash(base_urls["anthropic"]) + "/v1"),
        GEMINI: ("@ai-sdk/google", strip_slash(base_urls["gemini"]) + "/v1beta"),
    }.get(api, (None, None))
    check_api("opencode", api, ALL_APIS)
    home = Path(home)
    full = f"{PROVIDER_NAME}/{model}"
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            PROVIDER_NAME: {
                "npm": npm,
                "name": "polar gateway",
                "options": {"baseURL": base, "apiKey": key},
                "models": {model: {"name": model, "tool_call": True,
                                   "limit": {"context": limits.context_window,
                                             "output": limits.max_output}}},
            }
        },
        "model": full,
        "small_model": full,
        "enabled_providers": [PROVIDER_NAME],
        "permission": {"edit": "allow", "bash": "allow", "webfetch": "allow",
                       "external_directory": "allow", "doom_loop": "allow"},
        "autoupdate": False,
        "share": "disabled",
        "lsp": False,
        "formatter": False,
    }
    files = [write_json(home / ".config" / "opencode" / "opencode.json", config)]
    env = home_env(home)
    env.update({
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_SHARE": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
        "OPENCODE_DISABLE_CLAUDE_CODE": "1",
        "OPENCODE_DISABLE_TERMINAL_TITLE": "1",
    })
    prompt = home / ".polar-instruction"
    prompt.write_text(instruction)
    files.append(prompt)
    # Words appended to argv (extra args) are passed on after ``run --model M``.
    argv = ["sh", "-c", 'm=$1; p=$2; shift 2; exec "$0" run --model "$m" "$@" < "$p"',
            bin, full, str(prompt)]
    return CliLaunch("opencode", api, argv, env, files)


HARNESS = harness_class("opencode", PACKAGE, APIS, configure)  # what registry.py loads for agent.harness "opencode"
