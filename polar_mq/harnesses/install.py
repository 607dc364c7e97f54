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
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

from polar_mq.harnesses.base import HarnessPackage
from polar_mq.harnesses.registry import packages


# The pinned versions, each named in its harness's module (versions seen working headless against
# a local base URL: shared/notes/harnesses.md).
PACKAGES: Dict[str, HarnessPackage] = packages()

HARNESS_NAMES: List[str] = list(PACKAGES)


class InstallError(RuntimeError):
    """npm is missing or ``npm install`` failed."""


def default_cache_dir() -> Path:
    """``$POLAR_HARNESS_DIR`` if set, else ``~/.cache/polar_mq/harnesses``."""
    env = os.environ.get("POLAR_HARNESS_DIR")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "polar_mq" / "harnesses"


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


def npm_available() -> bool:
    """True when both ``npm`` and ``node`` are on PATH."""
    return shutil.which("npm") is not None and shutil.which("node") is not None


def _install_one(pkg: HarnessPackage, cache: Path, timeout: float, quiet: bool) -> Path:
    final = cache / pkg.dirname
    target = final / "node_modules" / ".bin" / pkg.bin
    if target.exists():
        return target
    if not npm_available():
        raise InstallError("npm/node not found on PATH; install Node.js >= 20 to use real harnesses")
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{pkg.dirname}.", dir=cache))
    cmd = [
        "npm", "install", "--prefix", str(tmp), pkg.spec,
        "--no-audit", "--no-fund", "--no-save", "--loglevel=error", "--no-update-notifier",
    ]
    env = dict(os.environ, npm_config_update_notifier="false", NO_UPDATE_NOTIFIER="1")
    try:
        proc = subprocess.run(
            cmd, env=env, timeout=timeout, text=True,
            stdout=subprocess.PIPE if quiet else None, stderr=subprocess.STDOUT if quiet else None,
        )
        if proc.returncode != 0:
            out = (proc.stdout or "")[-4000:]
            raise InstallError(f"{' '.join(cmd)} failed (exit {proc.returncode})\n{out}")
        if not (tmp / "node_modules" / ".bin" / pkg.bin).exists():
            raise InstallError(f"{pkg.spec} installed but provides no {pkg.bin!r} executable")
        if final.exists() and not target.exists():
            shutil.rmtree(final, ignore_errors=True)  # a broken earlier install
        try:
            os.rename(tmp, final)
        except OSError:
            # Another process finished first (final exists and is non-empty): keep theirs.
            if not target.exists():
                raise
    except subprocess.TimeoutExpired as e:
        raise InstallError(f"{' '.join(cmd)} timed out after {timeout:.0f}s") from e
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


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
    return {n: _install_one(PACKAGES[n], cache, timeout, quiet) for n in wanted}


def resolve_bin(name: str, options: Mapping[str, Any]) -> str:
    """The CLI executable: ``options.bin``, else the pinned install (installed now if missing)."""
    if options.get("bin"):
        return str(options["bin"])
    cache = options.get("install_dir")
    if is_installed(name, cache):
        return str(bin_path(name, cache))
    try:
        return str(install([name], cache)[name])
    except InstallError as exc:
        raise RuntimeError(f"harness {name!r} is not installed and could not be installed: {exc}. "
                           f"Run `polar-mq harness install {name}` on the worker host.") from exc


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
