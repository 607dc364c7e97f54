"""The harness interface, and the kit every real-CLI harness is built from.

A harness says how to launch one agent CLI headless against a gateway session: `launch(ctx)`
writes the CLI's config files into the session's HOME and returns the command and its env. The
six real CLIs (one module each: claude_code.py, codex.py, gemini_cli.py, qwen_code.py,
opencode.py, pi.py) are `CliHarness`es: a pinned npm package, the wire APIs the CLI speaks and a
`configure` function that writes its config files and returns a `CliLaunch`; what they share —
API names, HOME/XDG isolation, JSON config writing, base-URL spelling, the options check, the
max-turns hook — is here. `registry.py` lists them.

Tests: tests/harnesses/test_real_cli.py, tests/harnesses/test_harnesses_e2e.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence, Union

from polar_mq.harnesses.limits import ModelLimits, resolve
from polar_mq.harnesses.npm import HarnessPackage, resolve_bin

# --- the interface --------------------------------------------------------------------------------


@dataclass
class HarnessContext:
    session_id: str
    instruction: str
    model: str
    key: str  # the gateway session key, used as every provider's API key
    base_urls: dict[str, str]  # {"anthropic", "openai", "gemini"} from the gateway
    home: Path  # the session's HOME (config files go here)
    workdir: Path
    options: dict[str, Any] = field(default_factory=dict)
    max_model_len: int | None = None  # the served model's context length (None: unknown)
    sampling: dict[str, Any] = field(default_factory=dict)  # the task's agent.sampling


@dataclass
class Launch:
    command: str | list[str]
    env: dict[str, str]


def session_env(ctx: HarnessContext) -> dict[str, str]:
    """What every harness gets: the base URLs, the session key as every API key, the task."""
    return {
        "OPENAI_BASE_URL": ctx.base_urls["openai"],
        "OPENAI_API_KEY": ctx.key,
        "ANTHROPIC_BASE_URL": ctx.base_urls["anthropic"],
        "ANTHROPIC_API_KEY": ctx.key,
        "GOOGLE_GEMINI_BASE_URL": ctx.base_urls["gemini"],
        "GEMINI_API_KEY": ctx.key,
        "GOOGLE_API_KEY": ctx.key,
        "POLAR_SESSION_ID": ctx.session_id,
        "POLAR_INSTRUCTION": ctx.instruction,
        "POLAR_MODEL": ctx.model,
    }


class Harness(Protocol):
    name: str

    def launch(self, ctx: HarnessContext) -> Launch:
        """Write config files into ctx.home and return the headless command and its env."""


# --- the real-CLI kit -----------------------------------------------------------------------------
# The wire APIs, named as the CaptureRecord `provider` values.
ANTHROPIC = "anthropic"
OPENAI_CHAT = "openai_chat"
OPENAI_RESPONSES = "openai_responses"
GEMINI = "gemini"
ALL_APIS = (ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES, GEMINI)

#: What a harness is told when the caller passes no limits (no upstream to ask).
DEFAULT_LIMITS = resolve(None)

#: Name of the provider entry written into the CLIs' config files.
PROVIDER_NAME = "polar"

PathLike = Union[str, os.PathLike]


@dataclasses.dataclass
class CliLaunch:
    """What `configure` returns: argv, env (to merge over a base env), the files it wrote.

    Where a CLI reads standard input (Codex, opencode), ``argv`` redirects it itself through
    ``sh -c``, so a runtime may leave stdin as it likes.
    """

    harness: str
    api: str
    argv: list[str]
    env: dict[str, str]
    files: list[Path] = dataclasses.field(default_factory=list)


# configure(home, base_urls, key, model, instruction, *, api, bin, limits) -> CliLaunch: pure apart
# from writing config files under `home`; nothing is read from os.environ.
Configure = Callable[..., CliLaunch]


def check_api(harness: str, api: str, allowed: Sequence[str]) -> None:
    if api not in allowed:
        raise ValueError(f"{harness} cannot speak api={api!r}; choose one of {', '.join(allowed)}")


def write_json(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def home_env(home: Path) -> dict[str, str]:
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


def strip_slash(url: str) -> str:
    return url.rstrip("/")


def openai_v1(base_urls: Mapping[str, str]) -> str:
    """The OpenAI base (ends in ``/v1``)."""
    url = strip_slash(base_urls["openai"])
    return url if url.endswith("/v1") else url + "/v1"


def set_settings_turns(path: Path, turns: int) -> None:
    """``model.maxSessionTurns`` in a settings.json the CLI reads (Gemini CLI, Qwen Code)."""
    data = json.loads(path.read_text())
    data.setdefault("model", {})["maxSessionTurns"] = int(turns)
    path.write_text(json.dumps(data, indent=2) + "\n")


OPTIONS = {"api", "max_turns", "extra_args", "env", "bin", "install_dir", "context_window", "max_output_tokens"}


class CliHarness:
    """A real agent CLI run headless against the session's gateway base URLs.

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

    A subclass names its `package`, its `apis` (first = default) and its `configure` function; a
    CLI with a turn limit names the settings.json under HOME that holds it (`turns_settings`) or
    overrides `add_max_turns` (an argv flag).
    """

    name: str = ""
    package: HarnessPackage
    apis: tuple[str, ...] = ()
    configure: Configure
    turns_settings: str | None = None  # settings.json (under HOME) with model.maxSessionTurns

    def add_max_turns(self, argv: list[str], home: Path, turns: int) -> None:
        """Apply ``agent.options.max_turns`` (argv flag or config file); most CLIs have none."""
        if self.turns_settings is None:
            raise ValueError(f"agent.options.max_turns: {self.name} has no turn limit")
        set_settings_turns(home / self.turns_settings, turns)

    def build(self, home: PathLike, base_urls: Mapping[str, str], key: str, model: str, instruction: str, *,
              api: str | None = None, bin: PathLike | None = None, limits: ModelLimits | None = None) -> CliLaunch:
        """`configure` with the harness's native API, executable and limits unless given."""
        kwargs: dict[str, Any] = {"api": api or self.apis[0]}
        if bin is not None:
            kwargs["bin"] = os.fspath(bin)
        if limits is not None:
            kwargs["limits"] = limits
        return type(self).configure(home, base_urls, key, model, instruction, **kwargs)

    def launch(self, ctx: HarnessContext) -> Launch:
        opts = dict(ctx.options or {})
        unknown = sorted(set(opts) - OPTIONS)
        if unknown:
            raise ValueError(f"agent.options.{unknown[0]}: unknown option for {self.name} "
                             f"(known: {', '.join(sorted(OPTIONS))})")
        model_limits = resolve(ctx.max_model_len, opts, ctx.sampling)
        built = self.build(ctx.home, ctx.base_urls, ctx.key, ctx.model, ctx.instruction,
                           api=opts.get("api"), bin=resolve_bin(self.package, opts), limits=model_limits)
        argv = list(built.argv)
        turns = opts.get("max_turns")
        if turns is not None:
            self.add_max_turns(argv, Path(ctx.home), int(turns))
        extra = opts.get("extra_args") or []
        if isinstance(extra, str):
            extra = shlex.split(extra)
        argv += [str(a) for a in extra]
        polar = {k: v for k, v in session_env(ctx).items() if k.startswith("POLAR_")}
        env = {**polar, **built.env, **{k: str(v) for k, v in (opts.get("env") or {}).items()}}
        return Launch(command=argv, env=env)


def harness_class(name: str, package: HarnessPackage, apis: tuple[str, ...], configure: Configure, *,
                  turns_settings: str | None = None, max_turns_flag: str | None = None) -> type[CliHarness]:
    """The `CliHarness` of one CLI from its parts: what each harness module exports as HARNESS
    (registry.py loads it). `max_turns_flag`: the argv flag that limits turns, for a CLI that has one."""
    namespace: dict[str, Any] = {"name": name, "package": package, "apis": apis,
                                 "configure": staticmethod(configure), "turns_settings": turns_settings}
    if max_turns_flag is not None:
        flag = max_turns_flag

        def add_max_turns(self: CliHarness, argv: list[str], home: Path, turns: int) -> None:
            argv += [flag, str(turns)]
        namespace["add_max_turns"] = add_max_turns
    title = "".join(part.title() for part in name.split("_"))
    return type(f"{title}Harness", (CliHarness,), namespace)
