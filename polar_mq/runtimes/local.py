"""`local` runtime: a subprocess in a per-session directory (development; no isolation).

The harness runs in its own process group so a timeout or cancel kills the whole tree, and with
PR_SET_PDEATHSIG so it dies with the worker that started it; a takeover also kills the recorded
group, so a session is never run twice at the same time.

Tests: tests/runtimes/test_local_launch.py, tests/runtimes/test_logcap.py.
"""

from __future__ import annotations

import ctypes
import os
import queue
import re
import select
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable

from polar_mq.runtimes.logcap import RotatingLog, pump
from polar_mq.model import RuntimeHandle
from polar_mq.taskspec import RuntimeSpec
from polar_mq.runtimes.base import ExecResult, OnStart, copy_path, tail
from polar_mq.runtimes.orphans import owner_env

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


_SETPRIV = shutil.which("setpriv")


def spawn_args(argv: list[str]) -> tuple[list[str], Callable[[], None] | None]:
    """(argv, preexec_fn) that make the command die with this worker. With util-linux `setpriv`
    the death signal is set by an exec'd wrapper, so Python can start the child with vfork
    (no preexec_fn): a worker-sized process then spawns in well under a millisecond of its own
    CPU instead of a fork that copies its page tables (bench/bench_dispatch.py)."""
    if _SETPRIV:
        return [_SETPRIV, "--pdeathsig", "KILL", "--", *argv], None
    return argv, _die_with_parent


class _Spawner:
    """Starts harness processes from one long-lived thread of this process.

    PR_SET_PDEATHSIG (setpriv's, and bwrap's ``--die-with-parent``) fires when the THREAD that
    forked the child ends, not the process: a harness started straight from a pool thread (the
    default threads pool, slots.py) would be killed if that thread ever ended before it, and would
    outlive nothing else. Forking from a thread that lives as long as the process makes "dies with
    the worker" mean the worker process, whatever pool runs the stage
    (tests/pipeline/test_run_slots.py::test_harness_outlives_the_thread_that_asked_for_it). The main thread
    spawns directly (prefork's pool children run stages there)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = 0
        self._queue: queue.SimpleQueue[tuple[Callable[[], Any], list[Any], threading.Event]] = queue.SimpleQueue()

    def _loop(self) -> None:
        while True:
            fn, box, done = self._queue.get()
            try:
                box.append((True, fn()))
            except BaseException as exc:  # handed to the caller, which raises it
                box.append((False, exc))
            done.set()

    def call(self, fn: Callable[[], subprocess.Popen]) -> subprocess.Popen:
        if threading.current_thread() is threading.main_thread():
            return fn()
        with self._lock:
            if self._pid != os.getpid():  # first use in this process (a fork starts without the thread)
                self._queue = queue.SimpleQueue()
                threading.Thread(target=self._loop, name="polar-spawner", daemon=True).start()
                self._pid = os.getpid()
        box: list[Any] = []
        done = threading.Event()
        self._queue.put((fn, box, done))
        done.wait()
        ok, value = box[0]
        if not ok:
            raise value
        return value  # type: ignore[no-any-return]


spawner = _Spawner()


# Words bash passes through unchanged: no quoting, expansion, globbing, redirection or operators.
_PLAIN_WORD = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
# bash's builtins and keywords: a command starting with one of these needs bash (`true`/`false`
# without arguments exit the same as /usr/bin/true and /usr/bin/false, so they may skip it).
_BASH_ONLY = frozenset(
    ". : [ alias bg bind break builtin caller cd command compgen complete compopt continue declare dirs "
    "disown echo enable eval exec exit export false fc fg getopts hash help history jobs kill let local "
    "logout mapfile popd printf pushd pwd read readarray readonly return set shift shopt source suspend "
    "test times trap true type typeset ulimit umask unalias unset wait "
    "if then else elif fi case esac for select while until do done in function time coproc".split())


def command_argv(command: str | list[str], path: str) -> list[str]:
    """The argv that runs a harness or prepare command: a list as is; a string through `bash -c`,
    or directly when it is plain words whose first is an executable on `path` (the command's
    PATH) — then it is exactly the process `bash -c` would have exec'd, without a bash first.

    Not a login shell (`bash -lc`): /etc/profile resets the command's PATH to the system
    default, so a string command would see another PATH than an argv command or the runtime's
    `env` gave it, and reading the profiles costs CPU on every session."""
    if not isinstance(command, str):
        return list(command)
    words = re.split(r"[ \t]+", command.strip(" \t"))  # bash's word separators (a newline ends a command)
    if all(_PLAIN_WORD.fullmatch(w) for w in words) and "=" not in words[0]:
        head = words[0]
        if head in ("true", "false") and len(words) == 1:
            head = shutil.which(head, path=path) or ""
        elif head in _BASH_ONLY:
            head = ""
        # Only absolute PATH entries and absolute paths: the command runs in the work dir.
        found = shutil.which(head, path=os.pathsep.join(d for d in path.split(os.pathsep) if os.path.isabs(d))) \
            if head and ("/" not in head or os.path.isabs(head)) else None
        if found:
            return words
    return ["bash", "-c", command]


def kill_group(pgid: int, grace: float = 2.0) -> None:
    """SIGTERM the process group, then SIGKILL what is left after `grace` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 0)):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.time() + wait
        while time.time() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)


class ExitWatch:
    """Wait for a child's exit and wake at once when it happens (a pidfd, Linux ≥ 5.3), where
    Popen.wait(timeout) polls with sleeps that grow: that delay is idle time of a run slot
    at every session's end (bench/bench_pipeline.py hand-off)."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        try:
            self.fd: int | None = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):
            self.fd = None

    def wait(self, timeout: float) -> bool:
        """True once the child has exited (and been reaped)."""
        if self.fd is None:
            try:
                self.proc.wait(timeout=timeout)
                return True
            except subprocess.TimeoutExpired:
                return False
        # poll, not select.select: select refuses descriptors >= 1024, which a worker process
        # holding many files reaches (ValueError, not a wait)
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        poller.poll(max(0.0, timeout) * 1000)
        return self.proc.poll() is not None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def base_env(handle: RuntimeHandle, env: dict[str, str]) -> dict[str, str]:
    """The command's environment: PATH and LANG, the spec's env, the launch env, HOME, the
    owner marker."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8",
            **handle.env, **env, "HOME": env.get("HOME", handle.home),
            **owner_env(handle)}  # found again if this worker dies (runtimes/orphans.py)


def supervise(argv: list[str], *, cwd: str, env: dict[str, str], timeout: float | None, log_path: Path,
              should_stop: Callable[[], bool] | None = None,
              on_start: OnStart | None = None,
              heartbeat: Callable[[], None] | None = None, pass_fds: tuple[int, ...] = ()) -> ExecResult:
    """Run argv in its own process group (dying with this process), output appended to log_path;
    kill the group on timeout or stop, and whatever a finished command left behind. `pass_fds`
    stay open in the child (bwrap's --info-fd / --block-fd); `on_start` runs before anything else
    and may raise (the group is killed, the error propagates)."""
    log = RotatingLog(log_path)  # size-capped (POLAR_LOG_MAX_BYTES): output comes through a pipe
    t0 = time.monotonic()
    argv, preexec = spawn_args(argv)
    try:
        proc = spawner.call(lambda: subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=preexec, pass_fds=pass_fds))
    except BaseException:
        log.close()
        raise
    pumper = pump(proc.stdout, log)  # type: ignore[arg-type]
    try:
        if on_start:
            try:
                on_start({"pgid": proc.pid})
            except BaseException:
                kill_group(proc.pid)
                proc.wait()
                raise
        timed_out = stopped = False
        last_beat = 0.0
        exited = ExitWatch(proc)
        while True:
            if exited.wait(0.2):
                break
            elapsed = time.monotonic() - t0
            if timeout is not None and elapsed >= timeout:
                timed_out = True
            elif should_stop is not None and should_stop():
                stopped = True
            if timed_out or stopped:
                kill_group(proc.pid)
                proc.wait()
                break
            if heartbeat and elapsed - last_beat >= 1.0:
                heartbeat()
                last_beat = elapsed
        exited.close()
        kill_group(proc.pid, grace=0.5)  # leftovers of a finished command
    finally:
        pumper.join(2)  # the group is gone: the pipe ends (a process that escaped it may hold it)
        log.close()
    return ExecResult(exit_code=proc.returncode, timed_out=timed_out, stopped=stopped,
                      duration_s=time.monotonic() - t0, output_tail=tail(log_path),
                      log_path=str(log_path))


class LocalRuntime:
    backend = "local"

    def start(self, spec: RuntimeSpec, session_dir: Path, session_id: str) -> RuntimeHandle:
        workdir = session_dir / "work"
        home = session_dir / "home"
        workdir.mkdir(parents=True, exist_ok=True)
        home.mkdir(parents=True, exist_ok=True)
        return RuntimeHandle(backend=self.backend, session_dir=str(session_dir), workdir=str(workdir),
                             home=str(home), env=dict(spec.env))

    def exec(self, handle: RuntimeHandle, command: str | list[str], *, env: dict[str, str],
             timeout: float | None, log_path: Path, should_stop: Callable[[], bool] | None = None,
             on_start: OnStart | None = None, heartbeat: Callable[[], None] | None = None) -> ExecResult:
        full_env = base_env(handle, env)
        argv = command_argv(command, full_env["PATH"])
        if isinstance(command, str) and argv[0] != "bash":
            full_env.setdefault("PWD", handle.workdir)  # as bash would have exported it
        return supervise(argv, cwd=handle.workdir, env=full_env, timeout=timeout,
                         log_path=log_path, should_stop=should_stop, on_start=on_start,
                         heartbeat=heartbeat)

    def upload(self, handle: RuntimeHandle, src: Path, dst: str) -> None:
        copy_path(Path(src), Path(handle.workdir) / dst, make_parent=True)

    def download(self, handle: RuntimeHandle, src: str, dst: Path) -> None:
        copy_path(Path(handle.workdir) / src, Path(dst))

    def reap(self, handle: RuntimeHandle) -> None:
        if handle.pgid:
            kill_group(int(handle.pgid), grace=0.5)

    def stop(self, handle: RuntimeHandle) -> None:
        self.reap(handle)


def allow_local_exec_from_env() -> bool:
    """POLAR_ALLOW_LOCAL_EXEC, as PipelineSettings reads it (graders check fresh runtimes with it)."""
    return os.environ.get("POLAR_ALLOW_LOCAL_EXEC", "").lower() in ("1", "true", "yes")


def refused_prepare(handle: RuntimeHandle, step: dict[str, Any], allow_local_exec: bool) -> str | None:
    """Why a prepare step may not run, or None. The local runtime has no isolation: a submitted
    task's `exec` steps would run as the worker, so they run only on workers started with
    POLAR_ALLOW_LOCAL_EXEC=1 (settings.allow_local_exec). Harness commands are not affected.
    Init and a grader's fresh runtime (graders/workspace.py) both ask it."""
    if "exec" in step and handle.backend == "local" and not allow_local_exec:
        return ("refused: the local runtime has no isolation and this worker does not run prepare.exec "
                "of submitted tasks (use runtime.backend bwrap or docker, or start the worker with "
                "POLAR_ALLOW_LOCAL_EXEC=1 if every task is trusted)")
    return None
