"""The processes `polar-mq up` starts end when it dies, however it dies.

Two layers (tests/deploy/test_up_durable.py kills `up` with -9 and finds none of them after 5 s):
- every child is started with a parent-death signal (Linux `prctl(PR_SET_PDEATHSIG)`, set between
  fork and exec): SIGKILL for the roles (their own children follow: Celery's prefork children carry
  SIGKILL too; gunicorn's workers get SIGTERM, a graceful exit, when their master dies:
  serving.py), SIGTERM for the embedded Redis so it closes its append-only file cleanly;
- `up` holds `$POLAR_HOME/up.lock` (flock: a second `up` on the same home is refused while the
  first lives) and lists its children's process groups in `$POLAR_HOME/up.children`; a later
  `up` ends what that list still names (same pid *and* start time, so a reused pid is left alone)
  before it starts anything: the net under the signal (a child in its own session that outlives it).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Callable, TextIO

PR_SET_PDEATHSIG = 1

_prctl: Callable[..., int] | None = None
if sys.platform.startswith("linux"):
    try:
        _prctl = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).prctl
    except (OSError, AttributeError):
        _prctl = None


def die_with_parent(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A `preexec_fn` that makes the child receive `sig` when its parent dies (None off Linux).
    The libc function is looked up here, before the fork: the child only makes the call."""
    if _prctl is None:
        return None
    parent = os.getpid()
    return lambda: follow_parent(sig, parent)


def follow_parent(sig: int, parent: int) -> None:
    """In a freshly forked child of `parent`: receive `sig` when the parent dies (Linux only)."""
    if _prctl is None:
        return
    _prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() != parent:  # the parent died between fork and prctl: no signal will come
        os.kill(os.getpid(), int(sig))


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22), or None
    when it is gone or a zombie."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    if fields[0] in ("Z", "X"):
        return None
    return fields[19]


class UpLock:
    """`$POLAR_HOME/up.lock`, held while an `up` lives (the kernel drops it when it dies)."""

    def __init__(self, home: Path):
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.path = home / "up.lock"
        self.children_path = home / "up.children"
        self._fh: TextIO | None = None
        self._children: list[dict[str, object]] = []

    def acquire(self) -> None:
        fh = open(self.path, "a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "?"
            fh.close()
            raise RuntimeError(f"another `polar-mq up` (pid {holder}) is running with {self.path.parent}; "
                               f"stop it first, or set POLAR_HOME to another directory") from None
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        self._fh = fh

    def end_leftovers(self, grace: float = 5.0) -> int:
        """End the process groups a previous `up` listed that still run; how many there were."""
        try:
            listed = json.loads(self.children_path.read_text())
        except (OSError, ValueError):
            return 0
        alive = [c for c in listed if isinstance(c, dict) and start_time(int(c["pid"])) == c.get("start")]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for c in alive:
                try:
                    os.killpg(int(c["pid"]), sig)
                except (ProcessLookupError, PermissionError):
                    pass
            deadline = time.time() + grace
            while time.time() < deadline and any(start_time(int(c["pid"])) == c.get("start") for c in alive):
                time.sleep(0.1)
        if alive:
            print(f"ended {len(alive)} process group(s) a previous `polar-mq up` left running: "
                  f"{', '.join(str(c.get('name')) for c in alive)}", file=sys.stderr, flush=True)
        self.children_path.unlink(missing_ok=True)
        return len(alive)

    def add_child(self, name: str, pid: int) -> None:
        """List a child (the leader of its own process group) for a later `up` to find."""
        self._children.append({"name": name, "pid": pid, "start": start_time(pid)})
        tmp = self.children_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._children))
        os.replace(tmp, self.children_path)

    def release(self) -> None:
        self.children_path.unlink(missing_ok=True)
        if self._fh is not None:
            self._fh.close()
            self._fh = None
