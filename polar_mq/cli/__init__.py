"""Every `polar-mq` command: `commands` (the argument parser and sub-commands), `up` (all roles on
one machine), `demo`, the client commands (`submit`, `status`, `results`, ...), `dataset`,
`trainer`, `top`, and the embedded Redis the one-machine commands start."""

from __future__ import annotations

from typing import Any

from polar_mq import _forward


def main(argv: list[str] | None = None) -> Any:
    """The `polar-mq` console script (setup.py's entry point `polar_mq.cli:main`)."""
    from polar_mq.cli.commands import main as run

    return run(argv)


__getattr__ = _forward(__name__, "polar_mq.cli.commands")
