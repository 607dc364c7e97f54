"""Config files, environment and argv for running each real agent CLI headless.

Every function here is pure apart from writing config files under ``home``: given the HOME
directory to use for the run, the session's base URLs (``{"anthropic", "openai", "gemini"}`` as
returned by the gateway's ``POST /sessions``), the session key, the model name and the
instruction, it writes the CLI's config files into ``home`` and returns a :class:`Launch` with the
environment variables and argv of the headless run.  Nothing is read from ``os.environ``; the
caller merges ``Launch.env`` over its own base environment (PATH etc.) and runs ``Launch.argv``
in the task's work directory.  Telemetry, update checks and other non-essential traffic are
switched off everywhere.

``api`` selects the wire API where a CLI speaks several; the names are the CaptureRecord
``provider`` values: ``anthropic``, ``openai_chat``, ``openai_responses``, ``gemini``.

Facts (env names, config keys, quirks) are from ``shared/notes/harnesses.md`` and were verified
against the pinned versions in :mod:`polar_mq.harnesses.install`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Union

from .limits import ModelLimits, resolve

#: What a harness is told when the caller passes no limits (no upstream to ask).
DEFAULT_LIMITS = resolve(None)

ANTHROPIC = "anthropic"
OPENAI_CHAT = "openai_chat"
OPENAI_RESPONSES = "openai_responses"
GEMINI = "gemini"
ALL_APIS = (ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES, GEMINI)

PathLike = Union[str, os.PathLike]

#: Name of the provider entry written into the CLIs' config files.
PROVIDER_NAME = "polar"


@dataclasses.dataclass
class Launch:
    """What a runtime needs to start a harness: argv, env (to merge over a base env), files written.

    Where a CLI reads standard input (Codex, opencode), ``argv`` redirects it itself through
    ``sh -c``, so a runtime may leave stdin as it likes.
    """

    harness: str
    api: str
    argv: List[str]
    env: Dict[str, str]
    files: List[Path] = dataclasses.field(default_factory=list)


def _check_api(harness: str, api: str, allowed) -> None:
    if api not in allowed:
        raise ValueError(f"{harness} cannot speak api={api!r}; choose one of {', '.join(allowed)}")


def _write_json(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def _home_env(home: Path) -> Dict[str, str]:
    """HOME plus XDG dirs inside it, so no config or cache leaks between runs."""
    return {
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        # Generic opt-outs honoured by several Node CLIs.
        "DO_NOT_TRACK": "1",
        "NO_UPDATE_NOTIFIER": "1",
        "NO_COLOR": "1",
    }


def _strip_slash(url: str) -> str:
    return url.rstrip("/")


def _openai_v1(base_urls: Mapping[str, str]) -> str:
    """The OpenAI base (ends in ``/v1``)."""
    url = _strip_slash(base_urls["openai"])
    return url if url.endswith("/v1") else url + "/v1"


# --------------------------------------------------------------------------------------------
# Claude Code
# --------------------------------------------------------------------------------------------
def claude_code(home: PathLike, base_urls: Mapping[str, str], key: str, model: str,
                instruction: str, *, api: str = ANTHROPIC, bin: str = "claude",
                limits: ModelLimits = DEFAULT_LIMITS) -> Launch:
    """Claude Code: env only (``ANTHROPIC_BASE_URL``/``ANTHROPIC_API_KEY``/``ANTHROPIC_MODEL``).

    Runs ``claude -p TASK`` with the file/shell tools pre-approved.  The non-essential-traffic
    flag stops the title side request, update checks and telemetry.  Speaks Anthropic only.
    """
    _check_api("claude_code", api, (ANTHROPIC,))
    home = Path(home)
    # Skip the first-run onboarding screens (harmless in -p mode, needed for interactive use).
    files = [_write_json(home / ".claude.json", {
        "hasCompletedOnboarding": True, "autoUpdates": False, "numStartups": 1,
        "hasAcknowledgedCostThreshold": True,
    })]
    env = _home_env(home)
    env.update({
        "ANTHROPIC_BASE_URL": _strip_slash(base_urls["anthropic"]),
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
    return Launch("claude_code", api, argv, env, files)


# --------------------------------------------------------------------------------------------
# Codex CLI
# --------------------------------------------------------------------------------------------
CODEX_KEY_ENV = "POLAR_GW_API_KEY"


def codex(home: PathLike, base_urls: Mapping[str, str], key: str, model: str,
          instruction: str, *, api: str = OPENAI_RESPONSES, bin: str = "codex",
          limits: ModelLimits = DEFAULT_LIMITS) -> Launch:
    """Codex CLI: ``~/.codex/config.toml`` with a custom ``model_provider`` (``OPENAI_BASE_URL``
    is ignored by Codex).  ``wire_api = "responses"`` — this version rejects ``"chat"``.

    Runs ``codex exec --skip-git-repo-check TASK`` with approvals off and full filesystem access,
    standard input from ``/dev/null`` (``codex exec`` appends a piped stdin to the prompt and waits
    for it to close).
    """
    _check_api("codex", api, (OPENAI_RESPONSES,))
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
        f'base_url = {json.dumps(_openai_v1(base_urls))}',
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
    env = _home_env(home)
    env.update({"CODEX_HOME": str(codex_home), CODEX_KEY_ENV: key, "OPENAI_API_KEY": key})
    argv = ["sh", "-c", 'exec "$0" "$@" < /dev/null',
            bin, "exec", "--skip-git-repo-check", "--color", "never", instruction]
    return Launch("codex", api, argv, env, [cfg])


# --------------------------------------------------------------------------------------------
# Gemini CLI
# --------------------------------------------------------------------------------------------
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


def gemini_cli(home: PathLike, base_urls: Mapping[str, str], key: str, model: str,
               instruction: str, *, api: str = GEMINI, bin: str = "gemini",
               limits: ModelLimits = DEFAULT_LIMITS) -> Launch:
    """Gemini CLI: ``~/.gemini/settings.json`` selecting ``gemini-api-key`` auth (env alone fails
    with exit 41), env ``GOOGLE_GEMINI_BASE_URL``/``GEMINI_API_KEY``.  ``-m MODEL`` avoids the
    router/classifier side call.  Runs ``gemini -p TASK --yolo -m MODEL``.  Limits: the output
    cap as a ``modelConfigs.customOverrides`` entry for the model (``maxOutputTokens``), the
    window through ``model.compressionThreshold`` (gemini_compression_threshold).
    """
    _check_api("gemini_cli", api, (GEMINI,))
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
    files = [_write_json(home / ".gemini" / "settings.json", settings)]
    env = _home_env(home)
    env.update({
        "GEMINI_API_KEY": key,
        "GOOGLE_GEMINI_BASE_URL": _strip_slash(base_urls["gemini"]),
        "GEMINI_MODEL": model,
        "GEMINI_CLI_TRUST_WORKSPACE": "true",
        "GEMINI_CLI_NO_RELAUNCH": "true",
        "GEMINI_SANDBOX": "false",
    })
    argv = [bin, "-p", instruction, "--yolo", "-m", model]
    return Launch("gemini_cli", api, argv, env, files)


# --------------------------------------------------------------------------------------------
# Qwen Code
# --------------------------------------------------------------------------------------------
_QWEN_AUTH = {OPENAI_CHAT: "openai", ANTHROPIC: "anthropic", GEMINI: "gemini"}


def qwen_code(home: PathLike, base_urls: Mapping[str, str], key: str, model: str,
              instruction: str, *, api: str = OPENAI_CHAT, bin: str = "qwen",
              limits: ModelLimits = DEFAULT_LIMITS) -> Launch:
    """Qwen Code: env ``OPENAI_*`` (or ``ANTHROPIC_*`` / ``GEMINI_*``) plus ``~/.qwen/settings.json``
    with ``security.auth.selectedType`` and a ``modelProviders`` entry carrying the base URL.
    Runs ``qwen -p TASK --yolo``.  Limits: the window as the provider entry's
    ``generationConfig.contextWindowSize`` (provider entries are sealed: a top-level
    ``model.generationConfig`` would not reach it), the output cap as
    ``QWEN_CODE_MAX_OUTPUT_TOKENS`` (not ``samplingParams.max_tokens``, which would make it send
    its sampling keys verbatim); with either set it also stops its 8k → 64k retry of a
    truncated answer.
    """
    _check_api("qwen_code", api, tuple(_QWEN_AUTH))
    home = Path(home)
    auth = _QWEN_AUTH[api]
    base = {OPENAI_CHAT: _openai_v1(base_urls), ANTHROPIC: _strip_slash(base_urls["anthropic"]),
            GEMINI: _strip_slash(base_urls["gemini"])}[api]
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
    files = [_write_json(home / ".qwen" / "settings.json", settings)]
    env = _home_env(home)
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
    return Launch("qwen_code", api, argv, env, files)


# --------------------------------------------------------------------------------------------
# opencode
# --------------------------------------------------------------------------------------------
def opencode(home: PathLike, base_urls: Mapping[str, str], key: str, model: str,
             instruction: str, *, api: str = OPENAI_CHAT, bin: str = "opencode",
             limits: ModelLimits = DEFAULT_LIMITS) -> Launch:
    """opencode: ``~/.config/opencode/opencode.json`` with one provider whose ``options.baseURL``
    points at the gateway (without it nothing reaches the gateway).  ``openai_chat`` uses
    ``@ai-sdk/openai-compatible``; the other APIs use the AI SDK package of that provider.
    ``model`` and ``small_model`` are both set so the title side request goes to the gateway too.
    Runs ``opencode run --model polar/MODEL < HOME/.polar-instruction`` (via ``sh -c``): given as
    an argument, ``opencode run`` would wrap the instruction in double quotes (it quotes every argv
    word containing a space), so it goes in on stdin from a file instead.
    """
    npm, base = {
        OPENAI_CHAT: ("@ai-sdk/openai-compatible", _openai_v1(base_urls)),
        OPENAI_RESPONSES: ("@ai-sdk/openai", _openai_v1(base_urls)),
        ANTHROPIC: ("@ai-sdk/anthropic", _strip_slash(base_urls["anthropic"]) + "/v1"),
        GEMINI: ("@ai-sdk/google", _strip_slash(base_urls["gemini"]) + "/v1beta"),
    }.get(api, (None, None))
    _check_api("opencode", api, ALL_APIS)
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
    files = [_write_json(home / ".config" / "opencode" / "opencode.json", config)]
    env = _home_env(home)
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
    return Launch("opencode", api, argv, env, files)


# --------------------------------------------------------------------------------------------
# pi
# --------------------------------------------------------------------------------------------
PI_APIS = {
    OPENAI_CHAT: "openai-completions",
    OPENAI_RESPONSES: "openai-responses",
    ANTHROPIC: "anthropic-messages",
    GEMINI: "google-generative-ai",
}


def pi(home: PathLike, base_urls: Mapping[str, str], key: str, model: str,
       instruction: str, *, api: str = OPENAI_CHAT, bin: str = "pi",
       limits: ModelLimits = DEFAULT_LIMITS) -> Launch:
    """pi: ``~/.pi/agent/models.json`` with one provider (``baseUrl``, ``api`` one of
    ``openai-completions``/``openai-responses``/``anthropic-messages``/``google-generative-ai``,
    literal ``apiKey``).  ``api`` also accepts those pi names.  Runs
    ``pi -p --no-session --model polar/MODEL TASK``.
    """
    api = {v: k for k, v in PI_APIS.items()}.get(api, api)
    _check_api("pi", api, tuple(PI_APIS))
    home = Path(home)
    base = {
        OPENAI_CHAT: _openai_v1(base_urls),
        OPENAI_RESPONSES: _openai_v1(base_urls),
        ANTHROPIC: _strip_slash(base_urls["anthropic"]),
        GEMINI: _strip_slash(base_urls["gemini"]) + "/v1beta",
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
        _write_json(agent_dir / "models.json", {"providers": {PROVIDER_NAME: provider}}),
        _write_json(agent_dir / "settings.json", {
            "defaultProvider": PROVIDER_NAME, "defaultModel": model, "quietStartup": True,
            "collapseChangelog": True,
        }),
    ]
    env = _home_env(home)
    env.update({"PI_CODING_AGENT_DIR": str(agent_dir), "PI_OFFLINE": "1", "PI_TELEMETRY": "0",
                "PI_SKIP_VERSION_CHECK": "1"})
    argv = [bin, "-p", "--no-session", "--model", f"{PROVIDER_NAME}/{model}", instruction]
    return Launch("pi", api, argv, env, files)


#: Harness name → config function.
BUILDERS: Dict[str, Callable[..., Launch]] = {
    "claude_code": claude_code,
    "codex": codex,
    "gemini_cli": gemini_cli,
    "qwen_code": qwen_code,
    "opencode": opencode,
    "pi": pi,
}

#: Harness name → APIs it can speak (first = default).
SUPPORTED_APIS: Dict[str, tuple] = {
    "claude_code": (ANTHROPIC,),
    "codex": (OPENAI_RESPONSES,),
    "gemini_cli": (GEMINI,),
    "qwen_code": (OPENAI_CHAT, ANTHROPIC, GEMINI),
    "opencode": (OPENAI_CHAT, OPENAI_RESPONSES, ANTHROPIC, GEMINI),
    "pi": (OPENAI_CHAT, OPENAI_RESPONSES, ANTHROPIC, GEMINI),
}


#: Harnesses whose CLI has a context-window / output-limit setting (given ``limits``): all six
#: (Gemini CLI's window only through its compression threshold, see gemini_compression_threshold).
TAKES_LIMITS = ("claude_code", "codex", "opencode", "pi", "gemini_cli", "qwen_code")


def build(harness: str, home: PathLike, base_urls: Mapping[str, str], key: str, model: str,
          instruction: str, *, api: Optional[str] = None, bin: Optional[str] = None,
          limits: Optional[ModelLimits] = None) -> Launch:
    """Dispatch to the harness's function; ``api`` defaults to the harness's native API."""
    try:
        fn = BUILDERS[harness]
    except KeyError:
        raise ValueError(f"unknown harness {harness!r}; known: {', '.join(BUILDERS)}") from None
    kwargs = {"api": api or SUPPORTED_APIS[harness][0]}
    if bin is not None:
        kwargs["bin"] = os.fspath(bin)
    if limits is not None and harness in TAKES_LIMITS:
        kwargs["limits"] = limits
    return fn(home, base_urls, key, model, instruction, **kwargs)
