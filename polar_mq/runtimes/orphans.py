"""Orphaned runtimes: processes a dead worker left running on this host, found and killed.

A worker killed with SIGKILL cannot clean up. The harness it started dies with it
(PR_SET_PDEATHSIG; bwrap's `--die-with-parent` ends the whole sandbox), but what the harness
started itself — a test run, a dev server, a build — lives on in the session's process group with
nobody to stop it, for as long as it likes. A takeover kills the group recorded in the session's
runtime handle, but only for sessions that are taken over, and only the group it knows of (a
prepare step or a grader's command is never recorded).

So every process a worker starts through a runtime carries a marker in its environment
(inherited by everything below it, inside a bwrap sandbox too):

    POLAR_RUNTIME_OWNER=<node>|<deployment>|<session>|<supervisor pid>|<supervisor start time>

the supervisor being the worker process that watches it. When a worker starts (and then every
POLAR_ORPHAN_SCAN_INTERVAL seconds) it scans /proc for processes of its own node and deployment
(the pipeline's Redis) whose supervisor is no longer alive (pid gone, or reused: its start time
differs), kills their process groups and reports them: a warning naming the sessions and pids,
the `orphaned_runtimes_reaped` counter (`polar_mq_orphaned_runtimes_reaped_total` in the API's
/metrics, with `orphaned_processes_reaped` for the process count), and, for a session the
pipeline still knows, an `orphans_reaped` entry in its record's `events` (when, where, which pids).
Containers of the docker backend are found by their labels instead (runtimes/docker.py: sweep).
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polar_mq.model import RuntimeHandle

log = logging.getLogger("polar_mq.orphans")

OWNER_VAR = "POLAR_RUNTIME_OWNER"
_scope: dict[str, str] = {}


def set_scope(node: str, redis_url: str) -> None:
    """Called by a worker process at start: the processes it starts are marked with this node
    and deployment (a digest of the pipeline's Redis URL), so only workers of the same node and
    deployment ever reap them."""
    _scope["node"] = node
    _scope["deployment"] = deployment_id(redis_url)


def deployment_id(redis_url: str) -> str:
    return hashlib.blake2b(redis_url.encode(), digest_size=6).hexdigest()


def _start_time(pid: int) -> str | None:
    """A live process's start time in clock ticks since boot (/proc/<pid>/stat field 22); None
    when it is gone or a zombie (dead, not yet waited for)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def owner_env(handle: RuntimeHandle) -> dict[str, str]:
    """The marker for a command this process starts for `handle`'s session ({} outside a worker)."""
    if not _scope:
        return {}
    session = handle.session_id or Path(handle.session_dir).name
    pid = os.getpid()
    return {OWNER_VAR: "|".join([_scope["node"], _scope["deployment"], session, str(pid),
                                 _start_time(pid) or ""])}


@dataclass
class Orphan:
    session_id: str
    pgid: int
    pids: list[int] = field(default_factory=list)


def _environ_marker(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # gone, or not ours to read
        return None
    key = OWNER_VAR.encode() + b"="
    for entry in raw.split(b"\0"):
        if entry.startswith(key):
            return entry[len(key):].decode(errors="replace")
    return None


def find(node: str, deployment: str) -> list[Orphan]:
    """Processes of this node and deployment whose supervising worker is dead, by process group."""
    alive: dict[tuple[str, str], bool] = {}
    groups: dict[int, Orphan] = {}
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        marker = _environ_marker(pid)
        if not marker:
            continue
        parts = marker.split("|")
        if len(parts) != 5 or parts[0] != node or parts[1] != deployment:
            continue
        session, sup_pid, sup_start = parts[2], parts[3], parts[4]
        if (sup_pid, sup_start) not in alive:
            alive[(sup_pid, sup_start)] = sup_pid.isdigit() and _start_time(int(sup_pid)) == sup_start
        if alive[(sup_pid, sup_start)]:
            continue
        try:
            pgid = os.getpgid(pid)
        except ProcessLookupError:
            continue
        groups.setdefault(pgid, Orphan(session, pgid)).pids.append(pid)
    return sorted(groups.values(), key=lambda o: o.pgid)


def kill(orphans: list[Orphan], grace: float = 1.0) -> None:
    """SIGTERM each group (and each pid, should one have left its group), SIGKILL after `grace`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for o in orphans:
            for target in [o.pgid] + o.pids:
                try:
                    (os.killpg if target == o.pgid else os.kill)(target, sig)
                except (ProcessLookupError, PermissionError):
                    pass
        if sig == signal.SIGTERM:
            deadline = time.time() + grace
            while time.time() < deadline and any(_start_time(p) for o in orphans for p in o.pids):
                time.sleep(0.05)


def record(store, orphans: list[Orphan], node: str) -> None:
    """Report what was reaped: the counters, and an `orphans_reaped` entry in each known session's
    `events`."""
    if not orphans:
        return
    store.incr("orphaned_runtimes_reaped", len({o.session_id for o in orphans}))
    store.incr("orphaned_processes_reaped", sum(len(o.pids) for o in orphans))
    now = time.time()
    by_session: dict[str, list[Orphan]] = {}
    for o in orphans:
        by_session.setdefault(o.session_id, []).append(o)
    for sid, found in by_session.items():
        entry = {"event": "orphans_reaped", "at": now, "node": node, "pgids": [o.pgid for o in found],
                 "pids": sorted(p for o in found for p in o.pids)}
        _append_event(store, sid, entry)


def _append_event(store, session_id: str, entry: dict[str, Any]) -> None:
    """Append to the session record's `events` in one WATCH/MULTI, so a stage moving the session
    at the same moment loses nothing (the stages never write `events`; either write retries on the
    other's result); its `updated_at` is left alone (the janitor's takeover clock)."""
    import redis

    from polar_mq.model import SessionRecord
    from polar_mq.store.core import pack, unpack

    key = store.keys.session(session_id)
    while True:
        with store.r.pipeline() as pipe:
            try:
                pipe.watch(key)
                blob = pipe.get(key)
                if blob is None:
                    return
                rec = SessionRecord.from_dict(unpack(blob))
                rec.events = list(rec.events) + [entry]
                pipe.multi()
                pipe.set(key, pack(rec.to_dict()), keepttl=True)
                pipe.execute()
                return
            except redis.WatchError:
                continue


def reap(store, node: str, redis_url: str) -> list[Orphan]:
    """Find, kill and report the orphans of this node and deployment; returns them. One worker of
    a node scans at a time (a Redis lock), so nothing is counted twice."""
    lock = f"{store.keys.prefix}:orphans:scan:{node}"
    if not store.r.set(lock, os.getpid(), nx=True, px=30_000):
        return []
    try:
        orphans = find(node, deployment_id(redis_url))
        if orphans:
            _report_and_kill(store, orphans, node)
        return orphans
    finally:
        store.r.delete(lock)


def _report_and_kill(store, orphans: list[Orphan], node: str) -> None:
    log.warning("reaping %d orphaned runtime process group(s) a dead worker left on %s: %s", len(orphans), node,
                "; ".join(f"session {o.session_id} pgid {o.pgid} pids {o.pids}" for o in orphans))
    kill(orphans)
    record(store, orphans, node)
