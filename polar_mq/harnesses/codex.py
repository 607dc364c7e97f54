"""Codex CLI (`agent.harness: codex`): OpenAI Responses through a custom model provider.

``~/.codex/config.toml`` names a ``model_provider`` whose ``base_url`` is the session
(``OPENAI_BASE_URL`` is ignored by Codex); ``wire_api = "responses"`` (this version rejects
``"chat"``). Facts verified against the pinned version (shared/notes/harnesses.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping

from polar_mq.harnesses.base import (DEFAULT_LIMITS, OPENAI_RESPONSES, PROVIDER_NAME, CliLaunch, HarnessPackage,
                                     PathLike, check_api, harness_class, home_env, openai_v1)
from polar_mq.harnesses.limits import ModelLimits

PACKAGE = HarnessPackage("codex", "@openai/codex", "0.171.0", "codex")
APIS = (OPENAI_RESPONSES,)
CODEX_KEY_ENV = "POLAR_GW_API_KEY"


def configure(home: PathLike, base_urls: Mapping[str, str], key: str, model: str,
              instruction: str, *, api: str = OPENAI_RESPONSES, bin: str = "codex",
              limits: ModelLimits = DEFAULT_LIMITS) -> CliLaunch:
    """Codex CLI: ``~/.codex/config.toml`` with a custom ``model_provider``.

    Runs ``codex exec --skip-git-repo-check TASK`` with approvals off and full filesystem access,
    standard input from ``/dev/null`` (``codex exec`` appends a piped stdin to the prompt and waits
    for it to close).
    """
    check_api("codex", api, APIS)
    home = Path(home)
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    toml = "\n".join([
        f'model = {json.dumps(model)}',
        f'model_provider = "{PROVIDER_NAME}"',
        'approval_policy = "never"',
        'sandbox_mode = "danger-full-access"',
        'check_for_update_on_startup = false',
        'hide_agent_reasoning = true',
        f'model_context_window = {limits.context_window}',
        f'model_max_output_tokens = {limits.max_output}',
        '',
        f'[model_providers.{PROVIDER_NAME}]',
        'name = "polar gateway"',
        f'base_url = {json.dumps(openai_v1(base_urls))}',
        f'env_key = "{CODEX_KEY_ENV}"',
        'wire_api = "responses"',
        'request_max_retries = 1',
        'stream_max_retries = 1',
        '',
        '[analytics]',
        'enabled = false',
        '',
        '[feedback]',
        'enabled = false',
        '',
        '[otel]',
        'exporter = "none"',
        '',
    ])
    cfg = codex_home / "config.toml"
    cfg.write_text(toml)
    env = home_env(home)
    env.update({"CODEX_HOME": str(codex_home), CODEX_KEY_ENV: key, "OPENAI_API_KEY": key})
    argv = ["sh", "-c", 'exec "$0" "$@" < /dev/null',
            bin, "exec", "--skip-git-repo-check", "--color", "never", instruction]
    return CliLaunch("codex", api, argv, env, [cfg])


HARNESS = harness_class("codex", PACKAGE, APIS, configure)  # what registry.py loads for agent.harness "codex"
