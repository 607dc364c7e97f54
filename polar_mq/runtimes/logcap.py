"""Size-capped log files: a run of weeks must not fill the disk with one chatty harness.

Harness and prepare-step output (the runtimes' `log_path`) and the process logs `polar-mq up`
writes (gateway, API, workers, model server, Flower) go through a `RotatingLog`: when the file
would grow past `max_bytes` it is renamed to `<name>.1` (`.1` → `.2`, …; the oldest beyond
`backups` is dropped) and a new one is started, so one log never takes more than
`(backups + 1) × max_bytes` and its newest lines are always kept. The cut is made at a line end
when the chunk being written has one. `POLAR_LOG_MAX_BYTES` (default 64 MiB, 0: no cap) and
`POLAR_LOG_BACKUPS` (default 2) set the limits (settings.LogSettings).

The writers of these logs are child processes, so their output reaches us through a pipe that
`pump` copies into the RotatingLog (a file handed to a child directly cannot be rotated).

Tests: tests/runtimes/test_logcap.py.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import BinaryIO

from polar_mq.settings import LogSettings


def backup_path(path: Path, n: int) -> Path:
    return path.with_name(f"{path.name}.{n}")


class RotatingLog:
    """An append-only log file with a size cap and a bounded number of old files."""

    def __init__(self, path: Path, limits: LogSettings | None = None):
        self.path = Path(path)
        self.limits = limits or LogSettings.from_env()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: BinaryIO | None = open(self.path, "ab")
        self._size = self._fh.tell()
        self._lock = threading.Lock()

    def write(self, data: bytes) -> None:
        with self._lock:
            if self._fh is None:
                return  # closed: a straggler writer (a process that escaped its group)
            cap = self.limits.max_bytes
            if cap <= 0:
                self._fh.write(data)
                self._fh.flush()
                return
            while data:
                room = cap - self._size
                if len(data) <= room:
                    self._emit(data)
                    return
                if room > 0:  # fill this file up to its last whole line that fits, if any
                    cut = data.rfind(b"\n", 0, room) + 1
                    if cut == 0 and self._size == 0:
                        cut = room  # one line longer than the cap: split it
                    if cut:
                        self._emit(data[:cut])
                        data = data[cut:]
                if len(data) > cap * (self.limits.backups + 1):  # would rotate out anyway
                    data = data[-cap * (self.limits.backups + 1):]
                self._rotate()

    def _emit(self, data: bytes) -> None:
        assert self._fh is not None
        self._fh.write(data)
        self._fh.flush()
        self._size += len(data)

    def _rotate(self) -> None:
        assert self._fh is not None
        self._fh.close()
        backups = self.limits.backups
        if backups <= 0:
            self.path.unlink(missing_ok=True)
        else:
            backup_path(self.path, backups).unlink(missing_ok=True)
            for n in range(backups - 1, 0, -1):
                if backup_path(self.path, n).exists():
                    os.replace(backup_path(self.path, n), backup_path(self.path, n + 1))
            if self.path.exists():
                os.replace(self.path, backup_path(self.path, 1))
        self._fh = open(self.path, "ab")
        self._size = 0

    def close(self) -> None:
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None


def pump(source: BinaryIO, sink: RotatingLog, *, close_sink: bool = True) -> threading.Thread:
    """Copy everything read from `source` (a child's stdout pipe) into `sink` on a daemon thread,
    until end of file; returns the thread."""

    def loop() -> None:
        try:
            while True:
                chunk = source.read1(65536) if hasattr(source, "read1") else source.read(65536)
                if not chunk:
                    break
                sink.write(chunk)
        except (OSError, ValueError):  # the pipe was closed under us
            pass
        finally:
            try:
                source.close()
            except OSError:
                pass
            if close_sink:
                sink.close()

    thread = threading.Thread(target=loop, name=f"log-pump:{sink.path.name}", daemon=True)
    thread.start()
    return thread


def total_bytes(path: Path) -> int:
    """Bytes a log takes on disk, its old files included."""
    files = [Path(path)] + sorted(Path(path).parent.glob(Path(path).name + ".*"))
    return sum(f.stat().st_size for f in files if f.is_file())
