"""The six real agent CLIs as harness shortcuts (`agent.harness`).

Each one writes its config files into the session's HOME and returns the headless command with
its env, using :mod:`polar_mq.harnesses.configs` (config files, env, argv per CLI) and
:mod:`polar_mq.harnesses.install` (the pinned CLI, installed from npm on first use). The runtime
runs the command in the session's work dir and writes its output to the session's log file.

``agent.options`` (all optional):

* ``api``: the wire API where the CLI speaks several (opencode, pi, qwen_code): ``openai_chat``,
  ``openai_responses``, ``anthropic``, ``gemini`` (pi also takes its own names).
* ``max_turns``: claude_code (``--max-turns``), gemini_cli and qwen_code (``maxSessionTurns`` in
  settings.json); an error for the others, which have no such limit.
* ``extra_args``: a list of extra argv words appended to the CLI's command.
* ``env``: extra environment variables.
* ``bin``: the CLI executable to use instead of the installed pinned one.
* ``context_window`` / ``max_output_tokens``: what the CLI is told about its model (claude_code:
  output only; codex, opencode, pi: both); default the served model's ``max_model_len`` (see
  :mod:`polar_mq.harnesses.limits`).
* ``install_dir``: the harness cache dir (default ``$POLAR_HARNESS_DIR`` or
  ``~/.cache/polar_mq/harnesses``); a runtime with its own filesystem (docker) mounts it.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from . import configs, install, limits
from .base import HarnessContext, Launch, session_env

MAX_TURNS_FLAG = {"claude_code": "--max-turns"}
MAX_TURNS_SETTINGS = {"gemini_cli": ".gemini/settings.json", "qwen_code": ".qwen/settings.json"}


def resolve_bin(name: str, options: dict[str, Any]) -> str:
    """The CLI executable: ``options.bin``, else the pinned install (installed now if missing)."""
    if options.get("bin"):
        return str(options["bin"])
    cache = options.get("install_dir")
    if install.is_installed(name, cache):
        return str(install.bin_path(name, cache))
    try:
        return str(install.install([name], cache)[name])
    except install.InstallError as exc:
        raise RuntimeError(f"harness {name!r} is not installed and could not be installed: {exc}. "
                           f"Run `polar-mq harness install {name}` on the worker host.") from exc


def _set_max_turns(path: Path, turns: int) -> None:
    data = json.loads(path.read_text())
    data.setdefault("model", {})["maxSessionTurns"] = int(turns)
    path.write_text(json.dumps(data, indent=2) + "\n")


class CliHarness:
    """A real agent CLI run headless against the session's gateway base URLs."""

    name = ""

    def launch(self, ctx: HarnessContext) -> Launch:
        opts = dict(ctx.options or {})
        known = {"api", "max_turns", "extra_args", "env", "bin", "install_dir", "context_window",
                 "max_output_tokens"}
        unknown = sorted(set(opts) - known)
        if unknown:
            raise ValueError(f"agent.options.{unknown[0]}: unknown option for {self.name} "
                             f"(known: {', '.join(sorted(known))})")
        model_limits = limits.resolve(ctx.max_model_len, opts, ctx.sampling)
        built = configs.build(self.name, ctx.home, ctx.base_urls, ctx.key, ctx.model, ctx.instruction,
                              api=opts.get("api"), bin=resolve_bin(self.name, opts), limits=model_limits)
        argv = list(built.argv)
        turns = opts.get("max_turns")
        if turns is not None:
            if self.name in MAX_TURNS_FLAG:
                argv += [MAX_TURNS_FLAG[self.name], str(int(turns))]
            elif self.name in MAX_TURNS_SETTINGS:
                _set_max_turns(Path(ctx.home) / MAX_TURNS_SETTINGS[self.name], turns)
            else:
                raise ValueError(f"agent.options.max_turns: {self.name} has no turn limit")
        extra = opts.get("extra_args") or []
        if isinstance(extra, str):
            extra = shlex.split(extra)
        argv += [str(a) for a in extra]
        polar = {k: v for k, v in session_env(ctx).items() if k.startswith("POLAR_")}
        env = {**polar, **built.env, **{k: str(v) for k, v in (opts.get("env") or {}).items()}}
        return Launch(command=argv, env=env)


def _make(name: str) -> type:
    return type(f"{''.join(p.title() for p in name.split('_'))}Harness", (CliHarness,), {"name": name})


ClaudeCodeHarness = _make("claude_code")
CodexHarness = _make("codex")
GeminiCliHarness = _make("gemini_cli")
QwenCodeHarness = _make("qwen_code")
OpencodeHarness = _make("opencode")
PiHarness = _make("pi")
