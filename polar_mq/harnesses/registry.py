"""Which harnesses there are: `agent.harness` name → the module of that name in this package.

The names are the task spec's (`tasks.taskspec.HARNESSES`, checked when a task is submitted, in
the API process, which never loads harness code); each name is one module here that defines
`HARNESS`, its class. So adding a harness is one module plus its name in the spec.

Tests: tests/runtimes/test_runtimes_harness_launch.py, tests/pipeline/test_shape.py.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Mapping

from polar_mq.taskspec import HARNESSES
from polar_mq.harnesses.base import CliHarness, CliLaunch, Harness, HarnessPackage, PathLike
from polar_mq.harnesses.limits import ModelLimits

#: The real agent CLIs (installed from npm); `shell` runs any command.
CLI_HARNESSES = tuple(name for name in HARNESSES if name != "shell")


def harness_module(name: str) -> ModuleType:
    if name not in HARNESSES:
        raise ValueError(f"harness {name!r} has no launcher yet (available: {', '.join(sorted(HARNESSES))})")
    return importlib.import_module(f"{__package__}.{name}")


def get_harness(name: str) -> Harness:
    harness: Harness = harness_module(name).HARNESS()
    return harness


def cli_harness(name: str) -> CliHarness:
    if name not in CLI_HARNESSES:
        raise ValueError(f"unknown harness {name!r}; known: {', '.join(CLI_HARNESSES)}")
    harness: CliHarness = harness_module(name).HARNESS()
    return harness


def supported_apis() -> dict[str, tuple[str, ...]]:
    """Each real CLI → the wire APIs it speaks (first = its default)."""
    return {name: cli_harness(name).apis for name in CLI_HARNESSES}


def packages() -> dict[str, HarnessPackage]:
    """Each real CLI → its pinned npm package."""
    return {name: cli_harness(name).package for name in CLI_HARNESSES}


def build(harness: str, home: PathLike, base_urls: Mapping[str, str], key: str, model: str, instruction: str, *,
          api: str | None = None, bin: PathLike | None = None, limits: ModelLimits | None = None) -> CliLaunch:
    """A real CLI's config files and command for one session; ``api`` defaults to its native API."""
    return cli_harness(harness).build(home, base_urls, key, model, instruction, api=api, bin=bin, limits=limits)


__all__ = ["CLI_HARNESSES", "build", "cli_harness", "get_harness", "harness_module", "packages", "supported_apis"]
