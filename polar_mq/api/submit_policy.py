"""What a non-admin token may submit: the operator's `POLAR_SUBMIT_POLICY` YAML file.

A TaskRequest is code execution on a worker when it names the `local` runtime, gives commands
(shell harness `command`, a harness's `bin`, `runtime.prepare[].exec`, a grader's `command`) or loads a `module:Class`
plug-in (`subprocess:Popen` is one). The admin token may do all of it; every other token is held
to this policy, checked at submit (403 naming the rule, nothing stored or enqueued).

Schema (every key optional; docs/security.md):

    runtimes: [auto, bwrap, docker, apptainer]   # allowed runtime.backend values
    harnesses: null                               # allowed agent.harness values (null: any)
    images: null                                  # fnmatch patterns for runtime.image (null: any)
    commands: false                               # may give commands
    plugins: []                                   # module:Class patterns allowed besides installed
                                                  # entry points (fnmatch; "*" allows every one)

Defaults (no file): every runtime but `local`, any harness and image, no commands, only plug-ins
that are installed entry points (tests/trust/test_trust_roles.py).
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from polar_mq.taskspec import BACKENDS, TaskRequest

DEFAULT_RUNTIMES = tuple(b for b in BACKENDS if b != "local")
KEYS = ("runtimes", "harnesses", "images", "commands", "plugins")
ENTRY_POINT_PREFIX = "polar_mq."  # groups: polar_mq.graders, polar_mq.builders, ...


class PolicyError(ValueError):
    """The policy file cannot be used (unreadable, not YAML, a wrong key or type)."""


@dataclass(frozen=True)
class Refusal:
    rule: str
    detail: str


@dataclass(frozen=True)
class SubmitPolicy:
    runtimes: tuple[str, ...] = DEFAULT_RUNTIMES
    harnesses: tuple[str, ...] | None = None
    images: tuple[str, ...] | None = None
    commands: bool = False
    plugins: tuple[str, ...] = ()

    @classmethod
    def from_mapping(cls, data: Any, where: str = "policy") -> "SubmitPolicy":
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise PolicyError(f"{where}: must be a mapping with keys {', '.join(KEYS)}")
        unknown = sorted(set(data) - set(KEYS))
        if unknown:
            raise PolicyError(f"{where}: unknown key {unknown[0]!r} (allowed: {', '.join(KEYS)})")

        def names(key: str, default: tuple[str, ...] | None) -> tuple[str, ...] | None:
            value = data.get(key, default)
            if value is None:
                return None
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise PolicyError(f"{where}: {key} must be a list of strings (or null)")
            return tuple(value)

        commands = data.get("commands", False)
        if not isinstance(commands, bool):
            raise PolicyError(f"{where}: commands must be true or false")
        runtimes = names("runtimes", DEFAULT_RUNTIMES)
        bad = sorted(set(runtimes or ()) - set(BACKENDS))
        if bad:
            raise PolicyError(f"{where}: runtimes: unknown {bad[0]!r} (use {', '.join(BACKENDS)})")
        return cls(runtimes=BACKENDS if runtimes is None else runtimes, harnesses=names("harnesses", None),
                   images=names("images", None), commands=commands, plugins=names("plugins", ()) or ())


_CACHE: dict[str, tuple[float, SubmitPolicy]] = {}


def load(path: str | None = None) -> SubmitPolicy:
    """The policy in `path` (default POLAR_SUBMIT_POLICY), the defaults when none is set. Re-read
    when the file changes; a file that is set but unusable raises PolicyError (fail closed)."""
    path = path if path is not None else os.environ.get("POLAR_SUBMIT_POLICY") or None
    if not path:
        return SubmitPolicy()
    try:
        mtime = Path(path).stat().st_mtime
        cached = _CACHE.get(path)
        if cached is not None and cached[0] == mtime:
            return cached[1]
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeError, yaml.YAMLError) as exc:
        raise PolicyError(f"POLAR_SUBMIT_POLICY {path}: {exc}") from None
    policy = SubmitPolicy.from_mapping(data, f"POLAR_SUBMIT_POLICY {path}")
    _CACHE[path] = (mtime, policy)
    return policy


def installed_plugins() -> set[str]:
    """`module:Class` values of the entry points installed in polar_mq's groups."""
    out: set[str] = set()
    eps = metadata.entry_points()
    for group in eps.groups:
        if group.startswith(ENTRY_POINT_PREFIX):
            out.update(ep.value.replace(" ", "") for ep in eps.select(group=group))
    return out


def commands_of(task: TaskRequest) -> list[str]:
    """The fields of `task` that are commands run on a worker (or in its sandbox)."""
    found = []
    if task.agent.harness == "shell" and task.agent.options.get("command"):
        found.append("agent.options.command")
    if task.agent.options.get("bin"):  # the executable a harness runs, in place of its CLI
        found.append("agent.options.bin")
    for i, step in enumerate(task.runtime.prepare):
        if "exec" in step:
            found.append(f"runtime.prepare[{i}].exec")
    if "command" in (task.grader.config or {}):
        found.append("grader.config.command")
    return found


def check(task: TaskRequest, policy: SubmitPolicy) -> Refusal | None:
    """Why a non-admin token may not submit `task` under `policy`, or None."""
    if task.runtime.backend not in policy.runtimes:
        return Refusal("runtimes", f"submit policy rule 'runtimes': runtime.backend {task.runtime.backend!r} "
                                   f"is not allowed to this token (allowed: {', '.join(policy.runtimes) or 'none'})")
    if policy.harnesses is not None and task.agent.harness not in policy.harnesses:
        return Refusal("harnesses", f"submit policy rule 'harnesses': agent.harness {task.agent.harness!r} is "
                                    f"not allowed to this token (allowed: {', '.join(policy.harnesses) or 'none'})")
    if policy.images is not None and task.runtime.image is not None and \
            not any(fnmatch.fnmatchcase(task.runtime.image, pat) for pat in policy.images):
        return Refusal("images", f"submit policy rule 'images': runtime.image {task.runtime.image!r} matches "
                                 f"none of the allowed patterns ({', '.join(policy.images) or 'none'})")
    if not policy.commands:
        found = commands_of(task)
        if found:
            return Refusal("commands", f"submit policy rule 'commands': {found[0]} is a command, and this token "
                                       f"may not give commands (the operator's POLAR_SUBMIT_POLICY sets "
                                       f"commands: true to allow them)")
    installed: set[str] | None = None
    for field, strategy in (("builder.strategy", task.builder.strategy), ("grader.strategy", task.grader.strategy)):
        if ":" not in strategy:
            continue  # a name: a built-in, registered or installed entry point
        if any(fnmatch.fnmatchcase(strategy, pat) for pat in policy.plugins):
            continue
        installed = installed_plugins() if installed is None else installed
        if strategy.replace(" ", "") in installed:
            continue
        return Refusal("plugins", f"submit policy rule 'plugins': {field} {strategy!r} is a module:Class "
                                  f"plug-in that is not an installed entry point nor allowed by the policy's "
                                  f"plugins list")
    return None
