"""Every `polar-mq` command: `commands` (the argument parser and sub-commands), `up` (all roles on
one machine), `demo`, the client commands (`submit`, `status`, `results`, ...), `dataset`,
`trainer`, `top`, and the embedded Redis the one-machine commands start."""

from __future__ import annotations

import importlib
from typing import Any


def main(argv: list[str] | None = None) -> Any:
    """The `polar-mq` console script (setup.py's entry point `polar_mq.cli:main`)."""
    from polar_mq.cli.commands import main as run

    return run(argv)


def __getattr__(name: str) -> Any:
    module = importlib.import_module("polar_mq.cli.commands")
    try:
        return getattr(module, name)
    except AttributeError:
        raise AttributeError(f"module 'polar_mq.cli' has no attribute {name!r}") from None
