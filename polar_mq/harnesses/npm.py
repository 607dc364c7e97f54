"""The npm side of the real CLIs: a pinned package, where it is installed, installing it.

Imports nothing else of polar_mq.harnesses, so `base` (the launch) and `install` (the command)
both build on it without a cycle (.importlinter: no cycles)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import tempfile

from pathlib import Path
from typing import Any, Mapping


@dataclasses.dataclass(frozen=True)
class HarnessPackage:
    """One pinned npm package and the executable it provides (`install_package` installs it)."""

    name: str        # polar_mq harness name (TaskRequest agent.harness)
    package: str     # npm package name
    version: str     # pinned version
    bin: str         # executable name under node_modules/.bin

    @property
    def spec(self) -> str:
        return f"{self.package}@{self.version}"

    @property
    def dirname(self) -> str:
        return f"{self.name}-{self.version}"


class InstallError(RuntimeError):
    """npm is missing or ``npm install`` failed."""

def default_cache_dir() -> Path:
    """``$POLAR_HARNESS_DIR`` if set, else ``~/.cache/polar_mq/harnesses``."""
    env = os.environ.get("POLAR_HARNESS_DIR")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "polar_mq" / "harnesses"

def npm_available() -> bool:
    """True when both ``npm`` and ``node`` are on PATH."""
    return shutil.which("npm") is not None and shutil.which("node") is not None

def install_package(pkg: HarnessPackage, cache: Path, timeout: float, quiet: bool) -> Path:
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


def resolve_bin(pkg: HarnessPackage, options: Mapping[str, Any]) -> str:
    """The CLI executable: ``options.bin``, else the pinned install (installed now if missing)."""
    if options.get("bin"):
        return str(options["bin"])
    cache = Path(options["install_dir"]) if options.get("install_dir") else default_cache_dir()
    try:
        return str(install_package(pkg, cache, 1800.0, True))
    except InstallError as exc:
        raise RuntimeError(f"harness {pkg.name!r} is not installed and could not be installed: {exc}. "
                           f"Run `polar-mq harness install {pkg.name}` on the worker host.") from exc
