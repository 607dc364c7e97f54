"""Install the real agent CLIs ("harnesses") from npm into a local cache.

Each harness is pinned to one npm package version and installed with
``npm install --prefix <cache_dir>/<name>-<version> <package>@<version>`` into its own
directory, so several versions can live side by side and nothing touches the global npm
prefix.  An install is done only when the executable is missing (idempotent); it is built in a
temporary sibling directory and renamed into place when complete, so an interrupted or
concurrent install never leaves a half-populated directory behind at the final path.

The cache directory defaults to ``$POLAR_HARNESS_DIR``, else ``~/.cache/polar_mq/harnesses``.

Command line (wired as ``polar-mq harness install NAME...``)::

    polar-mq harness install [--dir DIR] NAME... | all
    polar-mq harness list
    polar-mq harness path NAME

Tests: tests/harnesses/test_harnesses_e2e.py, tests/harnesses/test_harness_limits.py.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

from polar_mq.harnesses.npm import (HarnessPackage, InstallError, default_cache_dir, install_package, npm_available)
from polar_mq.harnesses.npm import resolve_bin as npm_resolve_bin
from polar_mq.harnesses.registry import packages


# The pinned versions, each named in its harness's module (versions seen working headless against
# a local base URL: shared/notes/harnesses.md).
PACKAGES: Dict[str, HarnessPackage] = packages()

HARNESS_NAMES: List[str] = list(PACKAGES)


def _package(name: str) -> HarnessPackage:
    try:
        return PACKAGES[name]
    except KeyError:
        raise ValueError(f"unknown harness {name!r}; known: {', '.join(HARNESS_NAMES)}") from None


def install_dir(name: str, cache_dir: Optional[os.PathLike] = None) -> Path:
    """The npm ``--prefix`` directory for harness ``name``."""
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return cache / _package(name).dirname


def bin_path(name: str, cache_dir: Optional[os.PathLike] = None) -> Path:
    """Path of harness ``name``'s executable in the cache (whether or not it exists yet)."""
    return install_dir(name, cache_dir) / "node_modules" / ".bin" / _package(name).bin


def is_installed(name: str, cache_dir: Optional[os.PathLike] = None) -> bool:
    p = bin_path(name, cache_dir)
    return p.exists() and os.access(p, os.X_OK)




def install(
    names: Iterable[str],
    cache_dir: Optional[os.PathLike] = None,
    *,
    timeout: float = 1800.0,
    quiet: bool = True,
) -> Dict[str, Path]:
    """Install the named harnesses (missing ones only); return ``{name: executable path}``.

    ``names`` may contain ``"all"``.  Raises :class:`InstallError` on the first failure.
    """
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    wanted: List[str] = []
    for n in names:
        for m in (HARNESS_NAMES if n == "all" else [n]):
            _package(m)
            if m not in wanted:
                wanted.append(m)
    return {n: install_package(PACKAGES[n], cache, timeout, quiet) for n in wanted}


def resolve_bin(name: str, options: Mapping[str, Any]) -> str:
    """The CLI executable of harness `name`: ``options.bin``, else the pinned install."""
    return npm_resolve_bin(_package(name), options)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``[install] NAME...|all``, ``list`` or ``path NAME`` (``polar-mq harness ...``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    action = "install"
    if argv and argv[0] in ("install", "list", "path"):
        action = argv.pop(0)
    ap = argparse.ArgumentParser(
        prog=f"polar-mq harness {action}",
        description="Install pinned agent CLIs from npm into the harness cache "
                    "(actions: install NAME...|all, list, path NAME).",
    )
    ap.add_argument("names", nargs="*", help=f"harness names ({', '.join(HARNESS_NAMES)}) or 'all'")
    ap.add_argument("--dir", default=None, help="cache dir (default $POLAR_HARNESS_DIR or "
                    "~/.cache/polar_mq/harnesses)")
    ap.add_argument("--list", action="store_true", help="list pinned packages and install state")
    ap.add_argument("--verbose", action="store_true", help="show npm output")
    args = ap.parse_args(argv)
    cache = Path(args.dir).expanduser() if args.dir else default_cache_dir()
    try:
        if action == "path":
            for n in args.names:
                print(bin_path(n, cache))
            return 0
        if action == "list" or args.list or not args.names:
            for p in PACKAGES.values():
                state = "installed" if is_installed(p.name, cache) else "missing"
                print(f"{p.name:12s} {p.spec:40s} {state:9s} {bin_path(p.name, cache)}")
            return 0
        paths = install(args.names, cache, quiet=not args.verbose)
    except (InstallError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for n, path in paths.items():
        print(f"{n}\t{path}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
