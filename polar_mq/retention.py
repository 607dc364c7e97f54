"""Retention of finished tasks in Redis, and `polar-mq gc`.

Nothing expired before: a run of weeks filled Redis with every task, session, record and
trajectory ever made. Now a finished task (every session terminal) whose results were exported
(`GET /v1/tasks/<id>/results`) or acked by a trainer (`POST /v1/groups/<id>/ack`) gets a TTL (`POLAR_RETENTION_SECONDS`,
default 7 days) on every key it owns: the task and its session records, leases, trajectories,
and its gateway sessions (their records, chunks, key mapping, in-flight and cancel flags,
gateway-built trajectories), abandoned run attempts included. `polar-mq gc` applies the same to
finished tasks nobody exported within `--older-than`, drops index entries of expired tasks and
prunes their session directories (logs) on disk.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from . import states
from .cleanup import prune_task_dirs
from .model import GatewaySession, SessionRecord
from .store import Keys, unpack


def _sessions(r: redis.Redis, keys: Keys, task_id: str) -> list[SessionRecord]:
    sids = [s.decode() for s in r.lrange(keys.task_sessions(task_id), 0, -1)]
    out = []
    for sid in sids:
        blob = r.get(keys.session(sid))
        out.append(SessionRecord.from_dict(unpack(blob)) if blob else SessionRecord(session_id=sid, task_id=task_id))
    return out


def _gateway_keys(r: redis.Redis, keys: Keys, gw_sid: str) -> list[str]:
    found = list(keys.gateway_session_keys(gw_sid))
    blob = r.get(keys.gateway_session(gw_sid))
    if blob:
        found.append(keys.gateway_key(GatewaySession.from_dict(unpack(blob)).key))
    found.extend(k.decode() for k in r.scan_iter(match=f"{keys.trajectory(gw_sid, '*')}", count=1000))
    return found


def task_keys(r: redis.Redis, keys: Keys, task_id: str) -> list[str]:
    """Every Redis key a task owns (those that exist)."""
    found = list(keys.task_keys(task_id))
    for rec in _sessions(r, keys, task_id):
        found.extend(keys.session_keys(rec.session_id))
        gw_ids = [rec.gateway_session_id] + list((rec.stats or {}).get("abandoned_gateway_sessions") or [])
        for gw in dict.fromkeys(g for g in gw_ids if g):
            found.extend(_gateway_keys(r, keys, gw))
    found = list(dict.fromkeys(found))
    pipe = r.pipeline(transaction=False)
    for k in found:
        pipe.exists(k)
    return [k for k, hit in zip(found, pipe.execute()) if hit]


def is_finished(r: redis.Redis, keys: Keys, task_id: str) -> bool:
    recs = _sessions(r, keys, task_id)
    return bool(recs) and all(states.is_terminal(s.state) for s in recs)


def expire_task(r: redis.Redis, keys: Keys, task_id: str, ttl: float) -> int:
    """Give every key of the task the TTL (0: delete now); returns how many keys."""
    found = task_keys(r, keys, task_id)
    pipe = r.pipeline(transaction=False)
    for k in found:
        if ttl <= 0:
            pipe.delete(k)
        else:
            pipe.expire(k, max(1, int(ttl)))
    pipe.execute()
    return len(found)


def mark_exported(r: redis.Redis, keys: Keys, task_id: str, ttl: float) -> bool:
    """A finished task's results were exported or acked: its retention starts (again) now.
    Unfinished tasks are left alone (returns False)."""
    if ttl <= 0 or not is_finished(r, keys, task_id):
        return False
    r.set(keys.task_exported(task_id), str(time.time()))
    expire_task(r, keys, task_id, ttl)
    return True


@dataclass
class GcReport:
    tasks_seen: int = 0
    expiring: list[str] = field(default_factory=list)  # finished tasks given their TTL now
    deleted: list[str] = field(default_factory=list)  # finished long ago: removed now (--delete)
    index_dropped: list[str] = field(default_factory=list)  # index entries of expired tasks
    dirs_pruned: int = 0
    used_memory_before: int = 0
    used_memory_after: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"tasks_seen": self.tasks_seen, "expiring": len(self.expiring), "deleted": len(self.deleted),
                "index_dropped": len(self.index_dropped), "dirs_pruned": self.dirs_pruned,
                "used_memory_before": self.used_memory_before, "used_memory_after": self.used_memory_after,
                "freed_bytes": self.used_memory_before - self.used_memory_after}


def gc(r: redis.Redis, keys: Keys, *, retention: float, older_than: float, delete: bool = False,
       sessions_dir: str | None = None, dry_run: bool = False, now: float | None = None) -> GcReport:
    """Finished tasks created more than `older_than` seconds ago get the retention TTL (or are
    deleted now with `delete`); tasks whose keys expired leave the index and the disk."""
    now = now or time.time()
    report = GcReport(used_memory_before=int(r.info("memory").get("used_memory", 0)))
    gone_tasks: list[str] = []
    for raw, created in r.zscan_iter(keys.task_index(), count=1000):
        task_id = raw.decode()
        report.tasks_seen += 1
        if not r.exists(keys.task(task_id)):
            report.index_dropped.append(task_id)
            gone_tasks.append(task_id)
            continue
        if now - float(created) < older_than or not is_finished(r, keys, task_id):
            continue
        if delete:
            report.deleted.append(task_id)
            gone_tasks.append(task_id)
            if not dry_run:
                expire_task(r, keys, task_id, 0)
        elif r.ttl(keys.task(task_id)) < 0:  # not expiring yet
            report.expiring.append(task_id)
            if not dry_run:
                expire_task(r, keys, task_id, retention)
    if not dry_run:
        if gone_tasks:  # out of the task index and the trainers' group queue
            r.zrem(keys.task_index(), *gone_tasks)
            r.zrem(keys.groups_pending(), *gone_tasks)
            r.zrem(keys.groups_leased(), *gone_tasks)
        if sessions_dir:
            report.dirs_pruned = prune_task_dirs(Path(sessions_dir), gone_tasks)
    report.used_memory_after = int(r.info("memory").get("used_memory", 0))
    return report


def memory(r: redis.Redis) -> dict[str, int]:
    """Redis memory figures for /metrics (INFO memory)."""
    info = r.info("memory")
    return {k: int(info.get(k) or 0) for k in ("used_memory", "used_memory_rss", "used_memory_peak",
                                                "maxmemory", "used_memory_dataset")}
