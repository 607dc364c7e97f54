"""The runtime interface: where a session's harness runs (a process sandbox or a container).

A runtime is re-attachable: `start` returns a `model.RuntimeHandle` that is stored in the session
record, so the init worker can prepare a session and a run worker on another process (or host,
for shared backends) can execute in it, and a takeover after a worker died can reap what it left.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from polar_mq.model import RuntimeHandle
from polar_mq.taskspec import RuntimeSpec


@dataclass
class ExecResult:
    exit_code: int | None
    timed_out: bool = False
    stopped: bool = False  # stopped on request (cancel)
    duration_s: float = 0.0
    output_tail: str = ""
    log_path: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


# What `Runtime.exec` reports once its command runs: RuntimeHandle fields (pgid, exec_id).
OnStart = Callable[[dict[str, Any]], None]


class Runtime(Protocol):
    backend: str

    def start(self, spec: RuntimeSpec, session_dir: Path, session_id: str) -> RuntimeHandle:
        """Create the session's environment; returns its handle."""

    def exec(self, handle: RuntimeHandle, command: str | list[str], *, env: dict[str, str],
             timeout: float | None, log_path: Path, should_stop: Callable[[], bool] | None = None,
             on_start: OnStart | None = None, heartbeat: Callable[[], None] | None = None) -> ExecResult:
        """Run a command inside; on timeout or stop the process tree is killed *inside* the runtime
        and the output so far is kept in log_path. `on_start` gets the handle fields that find the
        running command again (pgid, exec_id), for the session record."""

    def upload(self, handle: RuntimeHandle, src: Path, dst: str) -> None: ...

    def download(self, handle: RuntimeHandle, src: str, dst: Path) -> None: ...

    def reap(self, handle: RuntimeHandle) -> None:
        """Kill whatever a previous (dead) worker left running for this session."""

    def stop(self, handle: RuntimeHandle) -> None:
        """Tear down; idempotent."""


def copy_path(src: Path, dst: Path, *, make_parent: bool = False) -> None:
    """A file, or a directory tree merged into `dst`: what upload and download do for runtimes
    whose session files are host paths (local, bwrap, apptainer)."""
    if make_parent:
        dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, dst, dirs_exist_ok=True)
    else:
        shutil.copy2(src, dst)


def _tail_bytes(path: Path, limit: int) -> bytes:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - limit))
            return fh.read()
    except OSError:
        return b""


def tail(path: Path, limit: int = 4000) -> str:
    """The last `limit` bytes of a log, reaching into its previous file when it was just rotated
    (polar_mq/runtimes/logcap.py)."""
    data = _tail_bytes(path, limit)
    if len(data) < limit:
        data = _tail_bytes(Path(f"{path}.1"), limit - len(data)) + data
    return data.decode(errors="replace")
