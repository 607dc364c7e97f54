"""Retention of finished tasks in Redis, and `polar-mq gc`.

Why: without it a run of weeks fills Redis with every task, session, record and trajectory ever
made (tests/store/test_retention.py). A finished task (every session terminal) whose results were exported
(`GET /v1/tasks/<id>/results`) or acked by a trainer (`POST /v1/groups/<id>/ack`) gets a TTL (`POLAR_RETENTION_SECONDS`,
default 7 days) on every key it owns: the task and its session records, leases, trajectories,
and its gateway sessions (their records, chunks, key mapping, in-flight and cancel flags,
gateway-built trajectories), abandoned run attempts included. `polar-mq gc` applies the same to
finished tasks nobody exported within `--older-than`, drops index entries of expired tasks and
prunes their session directories (logs) on disk.

The gateway may keep its records in a Redis of its own (`POLAR_GATEWAY_REDIS_URL` on the API and
`polar-mq gc --gateway-redis`): each function takes that client as `gw` and expires the gateway
sessions' keys there (`None`: the pipeline's Redis holds them too).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from polar_mq import states
from polar_mq.store import replies
from polar_mq._io.cleanup import prune_task_dirs
from polar_mq.model import GatewaySession, SessionRecord
from polar_mq.store.core import Keys, unpack


def _sessions(r: redis.Redis, keys: Keys, task_id: str) -> list[SessionRecord]:
    sids = replies.texts(r.lrange(keys.task_sessions(task_id), 0, -1))
    out = []
    for sid in sids:
        blob = replies.blob(r.get(keys.session(sid)))
        out.append(SessionRecord.from_dict(unpack(blob)) if blob else SessionRecord(session_id=sid, task_id=task_id))
    return out


def _gateway_keys(r: redis.Redis, keys: Keys, gw_sid: str) -> list[str]:
    found = list(keys.gateway_session_keys(gw_sid))
    blob = replies.blob(r.get(keys.gateway_session(gw_sid)))
    if blob:
        found.append(keys.gateway_key(GatewaySession.from_dict(unpack(blob)).key))
    found.extend(k.decode() for k in r.scan_iter(match=f"{keys.trajectory(gw_sid, '*')}", count=1000))
    return found


def _existing(r: redis.Redis, found: list[str]) -> list[str]:
    found = list(dict.fromkeys(found))
    pipe = r.pipeline(transaction=False)
    for k in found:
        pipe.exists(k)
    return [k for k, hit in zip(found, pipe.execute()) if hit]


def owned_keys(r: redis.Redis, keys: Keys, task_id: str,
               gw: redis.Redis | None = None) -> tuple[list[str], list[str]]:
    """The keys a task owns that exist: (in the pipeline's Redis, in the gateway's Redis). With
    one Redis for both (`gw` None or the same client) the second list is empty."""
    gw_client = gw if gw is not None else r
    pipeline_found = list(keys.task_keys(task_id))
    gateway_found: list[str] = []
    for rec in _sessions(r, keys, task_id):
        pipeline_found.extend(keys.session_keys(rec.session_id))
        gw_ids = [rec.gateway_session_id] + list((rec.stats or {}).get("abandoned_gateway_sessions") or [])
        for gw_sid in dict.fromkeys(g for g in gw_ids if g):
            gateway_found.extend(_gateway_keys(gw_client, keys, gw_sid))
    if gw is None or gw is r:
        return _existing(r, pipeline_found + gateway_found), []
    return _existing(r, pipeline_found), _existing(gw, gateway_found)


def task_keys(r: redis.Redis, keys: Keys, task_id: str, gw: redis.Redis | None = None) -> list[str]:
    """Every Redis key a task owns (those that exist), both Redis servers' together."""
    here, there = owned_keys(r, keys, task_id, gw)
    return here + there


def is_finished(r: redis.Redis, keys: Keys, task_id: str) -> bool:
    recs = _sessions(r, keys, task_id)
    return bool(recs) and all(states.is_terminal(s.state) for s in recs)


def _expire(r: redis.Redis, found: list[str], ttl: float) -> None:
    if not found:
        return
    pipe = r.pipeline(transaction=False)
    for k in found:
        if ttl <= 0:
            pipe.delete(k)
        else:
            pipe.expire(k, max(1, int(ttl)))
    pipe.execute()


def expire_task(r: redis.Redis, keys: Keys, task_id: str, ttl: float, gw: redis.Redis | None = None) -> int:
    """Give every key of the task the TTL (0: delete now), in both Redis servers; returns how
    many keys."""
    here, there = owned_keys(r, keys, task_id, gw)
    _expire(r, here, ttl)
    if there:
        _expire(gw, there, ttl)  # type: ignore[arg-type]
    return len(here) + len(there)


def mark_exported(r: redis.Redis, keys: Keys, task_id: str, ttl: float, gw: redis.Redis | None = None) -> bool:
    """A finished task's results were exported or acked: its retention starts (again) now.
    Unfinished tasks are left alone (returns False)."""
    if ttl <= 0 or not is_finished(r, keys, task_id):
        return False
    r.set(keys.task_exported(task_id), str(time.time()))
    expire_task(r, keys, task_id, ttl, gw)
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
    gateway_used_memory_before: int | None = None  # the gateway's own Redis, when it has one
    gateway_used_memory_after: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"tasks_seen": self.tasks_seen, "expiring": len(self.expiring), "deleted": len(self.deleted),
               "index_dropped": len(self.index_dropped), "dirs_pruned": self.dirs_pruned,
               "used_memory_before": self.used_memory_before, "used_memory_after": self.used_memory_after,
               "freed_bytes": self.used_memory_before - self.used_memory_after}
        if self.gateway_used_memory_before is not None and self.gateway_used_memory_after is not None:
            out.update({"gateway_used_memory_before": self.gateway_used_memory_before,
                        "gateway_used_memory_after": self.gateway_used_memory_after,
                        "gateway_freed_bytes": self.gateway_used_memory_before - self.gateway_used_memory_after})
        return out


def _used_memory(r: redis.Redis) -> int:
    return int(r.info("memory").get("used_memory", 0))


def gc(r: redis.Redis, keys: Keys, *, retention: float, older_than: float, delete: bool = False,
       sessions_dir: str | None = None, dry_run: bool = False, now: float | None = None,
       gw: redis.Redis | None = None) -> GcReport:
    """Finished tasks created more than `older_than` seconds ago get the retention TTL (or are
    deleted now with `delete`); tasks whose keys expired leave the index and the disk. `gw`: the
    gateway's Redis when it is not the pipeline's."""
    now = now or time.time()
    split = gw is not None and gw is not r
    report = GcReport(used_memory_before=_used_memory(r),
                      gateway_used_memory_before=_used_memory(gw) if split else None)  # type: ignore[arg-type]
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
                expire_task(r, keys, task_id, 0, gw)
        elif r.ttl(keys.task(task_id)) < 0:  # not expiring yet
            report.expiring.append(task_id)
            if not dry_run:
                expire_task(r, keys, task_id, retention, gw)
    if not dry_run:
        if gone_tasks:  # out of the task index and the trainers' group queue
            r.zrem(keys.task_index(), *gone_tasks)
            r.zrem(keys.groups_pending(), *gone_tasks)
            r.zrem(keys.groups_leased(), *gone_tasks)
        if sessions_dir:
            report.dirs_pruned = prune_task_dirs(Path(sessions_dir), gone_tasks)
    report.used_memory_after = _used_memory(r)
    if split:
        report.gateway_used_memory_after = _used_memory(gw)  # type: ignore[arg-type]
    return report


def memory(r: redis.Redis) -> dict[str, int]:
    """Redis memory figures for /metrics (INFO memory)."""
    info = r.info("memory")
    return {k: int(info.get(k) or 0) for k in ("used_memory", "used_memory_rss", "used_memory_peak",
                                                "maxmemory", "used_memory_dataset")}
