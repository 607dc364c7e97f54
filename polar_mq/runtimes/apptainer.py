"""`apptainer` runtime: a rootless Apptainer instance per session.

* ``start``: ``apptainer instance start --containall --no-home --cleanenv --pid --overlay
  SDIR/overlay --bind SDIR:SDIR [--nv] [--cpus N] [--memory MB] IMAGE polar-<session>``. The
  directory overlay makes the image writable for the session (rootless: needs unprivileged
  overlayfs or fuse-overlayfs, as Apptainer ≥ 1.1 provides); the session dir is bound at its own
  path (work dir, HOME, logs), and the harness cache read-only (the image needs ``node`` for the
  real CLIs). ``gpus`` → ``--nv``. ``cpus``/``memory_mb`` need cgroups v2 with systemd delegation.
* ``exec``: ``apptainer exec --cleanenv --pwd CWD instance://NAME CMD`` with the env passed as
  ``APPTAINERENV_*`` variables, supervised like the local runtime (own process group, dies with
  the worker). On timeout/stop, and after each command, everything in the instance except its
  init is killed *inside* it (``apptainer exec instance://NAME sh -c 'kill -TERM -1; ...'``); the
  output so far stays in the log.
* ``reap``: the same kill inside; ``stop``: ``apptainer instance stop NAME`` (idempotent).

Network: the instance shares the host's network namespace (the gateway on 127.0.0.1 is
reachable). Apptainer's ``--net --network none`` would cut the gateway off too, and a rootless
instance has no way to bridge it in, so ``allow_internet: false`` is NOT enforced here (a warning
is logged); use the docker or bwrap backend where that matters.

Apptainer cannot be installed on the machines this was built on: the tests check the commands
this module issues (argv), not a real instance.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable

from polar_mq.model import RuntimeHandle
from polar_mq.taskspec import RuntimeSpec
from polar_mq.runtimes.base import ExecResult, OnStart, copy_path
from polar_mq.runtimes.local import base_env, kill_group, supervise
from polar_mq.runtimes.orphans import owner_env

log = logging.getLogger("polar_mq.runtimes.apptainer")

KILL_ALL = "kill -TERM -1 2>/dev/null; sleep {grace}; kill -KILL -1 2>/dev/null; true"


def instance_name(session_id: str) -> str:
    return "polar-" + re.sub(r"[^a-zA-Z0-9_.-]", "-", session_id)[:100]


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=300)
    except FileNotFoundError:
        return subprocess.CompletedProcess(argv, 127, "", f"{argv[0]}: not found (install Apptainer)")


class ApptainerRuntime:
    backend = "apptainer"

    def __init__(self, binary: str | None = None, runner: Callable[[list[str]], Any] | None = None,
                 supervisor: Callable[..., ExecResult] | None = None):
        self.binary = binary or os.environ.get("POLAR_APPTAINER") or shutil.which("apptainer") \
            or shutil.which("singularity") or "apptainer"
        self.runner = runner or _run
        self.supervisor = supervisor or supervise

    # ---- argv builders (what the tests check) ----------------------------------------------------
    def start_argv(self, spec: RuntimeSpec, sdir: Path, name: str) -> list[str]:
        from polar_mq.harnesses.install import default_cache_dir

        argv = [self.binary, "instance", "start", "--containall", "--no-home", "--cleanenv", "--pid",
                "--overlay", str(sdir / "overlay"), "--bind", f"{sdir}:{sdir}"]
        cache = default_cache_dir()
        try:
            cache.mkdir(parents=True, exist_ok=True)
        except OSError:
            pass
        if cache.is_dir():
            argv += ["--bind", f"{cache}:{cache}:ro"]
        if spec.gpus:
            argv.append("--nv")
        if spec.cpus:
            argv += ["--cpus", str(spec.cpus)]
        if spec.memory_mb:
            argv += ["--memory", f"{int(spec.memory_mb)}M"]
        return argv + [str(spec.image), name]

    def exec_argv(self, handle: RuntimeHandle, command: list[str]) -> list[str]:
        return [self.binary, "exec", "--cleanenv", "--pwd", handle.workdir,
                f"instance://{handle.instance}", *command]

    def kill_argv(self, handle: RuntimeHandle, grace: float = 1.0) -> list[str]:
        return [self.binary, "exec", f"instance://{handle.instance}", "sh", "-c",
                KILL_ALL.format(grace=grace)]

    def stop_argv(self, handle: RuntimeHandle) -> list[str]:
        return [self.binary, "instance", "stop", str(handle.instance)]

    # ---- lifecycle ------------------------------------------------------------------------------
    def start(self, spec: RuntimeSpec, session_dir: Path, session_id: str) -> RuntimeHandle:
        if not spec.image:
            raise ValueError("runtime.image is required for the apptainer backend")
        if not spec.allow_internet:
            log.warning("apptainer: allow_internet=false is not enforced (the instance shares the "
                        "host network so that it reaches the gateway)")
        sdir = Path(session_dir).resolve()
        work, home = sdir / "work", sdir / "home"
        for d in (work, home, sdir / "logs", sdir / "overlay"):
            d.mkdir(parents=True, exist_ok=True)
        name = instance_name(session_id)
        handle = RuntimeHandle(backend=self.backend, instance=name, session_dir=str(sdir),
                               workdir=spec.workdir or str(work), host_workdir=str(work), home=str(home),
                               env=dict(spec.env))
        self.runner(self.stop_argv(handle))  # an earlier init attempt's instance
        res = self.runner(self.start_argv(spec, sdir, name))
        if getattr(res, "returncode", 0) != 0:
            raise RuntimeError(f"apptainer instance start failed: {getattr(res, 'stderr', '')[-2000:]}")
        if spec.workdir:
            self.runner([self.binary, "exec", f"instance://{name}", "mkdir", "-p", spec.workdir])
        return handle

    def exec(self, handle: RuntimeHandle, command: str | list[str], *, env: dict[str, str],
             timeout: float | None, log_path: Path, should_stop: Callable[[], bool] | None = None,
             on_start: OnStart | None = None, heartbeat: Callable[[], None] | None = None) -> ExecResult:
        cmd = ["sh", "-c", command] if isinstance(command, str) else list(command)
        inner = base_env(handle, env)
        host_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **owner_env(handle),
                    **{f"APPTAINERENV_{k}": v for k, v in inner.items() if k != "PATH"}}
        result = self.supervisor(self.exec_argv(handle, cmd), cwd=handle.session_dir, env=host_env,
                                 timeout=timeout, log_path=log_path, should_stop=should_stop,
                                 on_start=on_start, heartbeat=heartbeat)
        # What the command left inside the instance (all of it, after a timeout or stop).
        self.runner(self.kill_argv(handle, grace=1.0 if (result.timed_out or result.stopped) else 0.2))
        return result

    def upload(self, handle: RuntimeHandle, src: Path, dst: str) -> None:
        copy_path(Path(src), self._host_path(handle, dst), make_parent=True)

    def download(self, handle: RuntimeHandle, src: str, dst: Path) -> None:
        copy_path(self._host_path(handle, src), Path(dst))

    def _host_path(self, handle: RuntimeHandle, path: str) -> Path:
        """Files move through the bound session dir; paths elsewhere in the instance are reached
        through the overlay's upper dir."""
        full = path if path.startswith("/") else os.path.join(handle.workdir, path)
        if full == handle.session_dir or full.startswith(handle.session_dir + "/"):
            return Path(full)
        return Path(handle.session_dir) / "overlay" / "upper" / full.lstrip("/")

    def reap(self, handle: RuntimeHandle | None) -> None:
        if not handle:
            return
        if handle.pgid:
            kill_group(int(handle.pgid), grace=0.5)
        self.runner(self.kill_argv(handle, grace=0.5))

    def stop(self, handle: RuntimeHandle | None) -> None:
        if handle:
            self.runner(self.stop_argv(handle))
