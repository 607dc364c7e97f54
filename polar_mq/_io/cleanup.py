"""Disk a long run must not keep: per-session work dirs after postrun, old session logs.

A session's directory (`sessions_dir/<task>/<session>`) holds its HOME (harness caches: often
hundreds of MB of node and tool state), its work dir and its logs. After postrun the trajectory
and the grade are stored, so everything but `logs/` goes, unless the task asks to keep it
(`runtime.keep_workdir`) or the workers run with `POLAR_KEEP_WORKDIRS=1`. The logs stay until
`polar-mq gc` prunes the directories of tasks past their retention.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

log = logging.getLogger("polar_mq._io.cleanup")

KEEP = {"logs"}


def remove_workdirs(session_dir: Path) -> int:
    """Remove everything in a session dir but its logs; returns how many entries went."""
    if not session_dir.is_dir() or session_dir.is_symlink():
        return 0
    removed = 0
    for entry in session_dir.iterdir():
        if entry.name in KEEP:
            continue
        try:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
            removed += 1
        except OSError as exc:  # a file a container left read-only: report, never fail postrun
            log.warning("could not remove %s: %s", entry, exc)
    return removed


def prune_task_dirs(sessions_dir: Path, task_ids: list[str]) -> int:
    """Remove the whole directories (logs included) of these tasks; returns how many went."""
    n = 0
    root = sessions_dir.resolve()
    for task_id in task_ids:
        path = (sessions_dir / task_id).resolve()
        if path.parent != root or not path.is_dir():
            continue  # never outside sessions_dir
        shutil.rmtree(path, ignore_errors=True)
        n += 1
    return n


def prune_old_dirs(sessions_dir: Path, older_than: float, now: float | None = None) -> list[str]:
    """Task directories whose newest change is older than `older_than` seconds (orphans of
    tasks Redis no longer knows included); removed, and their names returned."""
    now = now or time.time()
    if not sessions_dir.is_dir():
        return []
    gone = []
    for task_dir in sessions_dir.iterdir():
        if not task_dir.is_dir() or task_dir.is_symlink():
            continue
        newest = max((p.stat().st_mtime for p in task_dir.rglob("*") if not p.is_symlink()),
                     default=task_dir.stat().st_mtime)
        if now - newest > older_than:
            shutil.rmtree(task_dir, ignore_errors=True)
            gone.append(task_dir.name)
    return gone
