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

The janitor collects on its own (`collect`, run by tasks/worker/retention_sweep.py every
`POLAR_RETENTION_SWEEP_SECONDS`): (a) finished tasks nobody exported or acked, finished longer
than the retention ago, are deleted with every key they own; (b) orphan gateway sessions (no task
of the pipeline owns them: created directly with `POST /sessions`, or their task is gone) idle
longer than the retention are deleted with every key they own. `polar-mq gc` runs the same two
steps by hand (`gc` and `collect_orphan_sessions`); `drop_task` and `collect_orphan_sessions` are
the one way a task or an orphan gateway session is removed. A task's rubric judge session (`judge_session_id`)
is the task's: it expires and is collected with it. Guarded by tests/store/test_retention.py and
tests/pipeline/test_janitor_retention.py.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from polar_mq import states
from polar_mq.store import codec as record_codec
from polar_mq.store import replies
from polar_mq._io.cleanup import prune_task_dirs
from polar_mq.model import GatewaySession, SessionRecord
from polar_mq.store.core import Keys, unpack
from polar_mq.store.lost_calls import LostCalls


def judge_session_id(session_id: str) -> str:
    """The gateway session of a session's rubric judge (graders/rubric.py): owned by the task."""
    return f"{session_id}.judge"


def _sessions(r: redis.Redis, keys: Keys, task_id: str) -> list[SessionRecord]:
    sids = replies.texts(r.lrange(keys.task_sessions(task_id), 0, -1))
    out = []
    blobs = [replies.blob(b) for b in r.mget([keys.session(sid) for sid in sids])] if sids else []
    for sid, blob in zip(sids, blobs):
        out.append(SessionRecord.from_dict(unpack(blob)) if blob else SessionRecord(session_id=sid, task_id=task_id))
    return out


def _gateway_keys(r: redis.Redis, keys: Keys, gw_sid: str, scan: bool = True) -> list[str]:
    """Every key of one gateway session (`_gateway_keys_of`)."""
    return _gateway_keys_of(r, keys, [gw_sid], scan)


def _gateway_keys_of(r: redis.Redis, keys: Keys, gw_sids: list[str], scan: bool = True) -> list[str]:
    """Every key of these gateway sessions (their records read in one MGET). `scan`: also
    trajectories saved under other builders' names than the two in `Keys.gateway_session_keys`
    (a SCAN of the whole keyspace per session: `polar-mq gc` and the API's export do it, the
    janitor's pass does not)."""
    found: list[str] = []
    blobs = [replies.blob(b) for b in r.mget([keys.gateway_session(s) for s in gw_sids])] if gw_sids else []
    for gw_sid, blob in zip(gw_sids, blobs):
        found.extend(keys.gateway_session_keys(gw_sid))
        if not blob:  # never created (a session without a judge) or gone: no scan for its trajectories
            continue
        found.append(keys.gateway_key(GatewaySession.from_dict(unpack(blob)).key))
        if scan:
            found.extend(k.decode() for k in r.scan_iter(match=f"{keys.trajectory(gw_sid, '*')}", count=1000))
    return found


def _existing(r: redis.Redis, found: list[str]) -> list[str]:
    found = list(dict.fromkeys(found))
    pipe = r.pipeline(transaction=False)
    for k in found:
        pipe.exists(k)
    return [k for k, hit in zip(found, pipe.execute()) if hit]


def owned_keys(r: redis.Redis, keys: Keys, task_id: str,
               gw: redis.Redis | None = None, scan: bool = True) -> tuple[list[str], list[str]]:
    """The keys a task owns that exist: (in the pipeline's Redis, in the gateway's Redis). With
    one Redis for both (`gw` None or the same client) the second list is empty."""
    gw_client = gw if gw is not None else r
    pipeline_found = list(keys.task_keys(task_id))
    gw_sids: list[str] = []
    for rec in _sessions(r, keys, task_id):
        pipeline_found.extend(keys.session_keys(rec.session_id))
        gw_sids += ([rec.gateway_session_id] + list((rec.stats or {}).get("abandoned_gateway_sessions") or [])
                    + [judge_session_id(rec.session_id)])
    gateway_found = _gateway_keys_of(gw_client, keys, list(dict.fromkeys(g for g in gw_sids if g)), scan)
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


def expire_task(r: redis.Redis, keys: Keys, task_id: str, ttl: float, gw: redis.Redis | None = None,
                scan: bool = True) -> int:
    """Give every key of the task the TTL (0: delete now), in both Redis servers; returns how
    many keys."""
    here, there = owned_keys(r, keys, task_id, gw, scan)
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


def _unindex(r: redis.Redis, keys: Keys, task_ids: list[str]) -> None:
    """Out of the task index and the trainers' group queues."""
    if task_ids:
        pipe = r.pipeline(transaction=False)
        pipe.zrem(keys.task_index(), *task_ids)
        pipe.zrem(keys.groups_pending(), *task_ids)
        pipe.zrem(keys.groups_leased(), *task_ids)
        pipe.execute()


# KEYS: task index, groups pending, groups leased. ARGV: per task: its id, how many keys it owns
# by name (Keys.task_keys: its record first), those names. A task whose record exists again (the
# same id resubmitted meanwhile: `submit --dataset` derives ids) is left alone.
_FORGET = """
local i = 1
while i <= #ARGV do
  local id, n = ARGV[i], tonumber(ARGV[i + 1])
  if redis.call('EXISTS', ARGV[i + 2]) == 0 then
    redis.call('ZREM', KEYS[1], id)
    redis.call('ZREM', KEYS[2], id)
    redis.call('ZREM', KEYS[3], id)
    for j = i + 3, i + 1 + n do redis.call('DEL', ARGV[j]) end
  end
  i = i + 2 + n
end
return 0
"""


def _forget(r: redis.Redis, keys: Keys, task_ids: list[str]) -> None:
    """Tasks whose record expired: out of the indexes, and any task-level key written after its
    TTL was given (none should be: pipeline.py `_follow_task_ttl`) deleted with them; atomic per
    batch, so a task created again with the same id meanwhile keeps everything."""
    for batch in _batches(task_ids, 200):
        args: list[str | int] = []
        for t in batch:
            names = keys.task_keys(t)
            args += [t, len(names), *names]
        r.eval(_FORGET, 3, keys.task_index(), keys.groups_pending(), keys.groups_leased(), *args)


def drop_task(r: redis.Redis, keys: Keys, task_id: str, gw: redis.Redis | None = None, scan: bool = True) -> int:
    """Delete every key the task owns now (both Redis servers) and take it out of the indexes;
    returns how many keys were deleted. The one way a task is removed (`gc --delete`, the janitor)."""
    here, there = owned_keys(r, keys, task_id, gw, scan)
    _expire(r, here, 0)
    g = gw if gw is not None else r
    if there:
        _expire(g, there, 0)
    prefix = keys.gateway_session("")
    gone_sessions = [k[len(prefix):] for k in here + there if k.startswith(prefix)]
    if gone_sessions:  # out of the sessions index too (no orphan check for them later)
        g.zrem(keys.gateway_sessions_index(), *gone_sessions)
    _unindex(r, keys, [task_id])
    return len(here) + len(there)


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
                drop_task(r, keys, task_id, gw)
        elif r.ttl(keys.task(task_id)) < 0:  # not expiring yet
            report.expiring.append(task_id)
            if not dry_run:
                expire_task(r, keys, task_id, retention, gw)
    if not dry_run:
        _forget(r, keys, report.index_dropped)
        if sessions_dir:
            report.dirs_pruned = prune_task_dirs(Path(sessions_dir), gone_tasks)
    report.used_memory_after = _used_memory(r)
    if split:
        report.gateway_used_memory_after = _used_memory(gw)  # type: ignore[arg-type]
    return report


# --- the janitor's collection (and `polar-mq gc`'s orphan sessions) ---------------------------
# Its counters (store counters: /metrics shows each as polar_mq_<name>_total, 0 before the first).
COUNTERS = ("janitor_collected_tasks", "janitor_collected_sessions", "janitor_collected_keys")


@dataclass
class Collected:
    tasks: list[str] = field(default_factory=list)  # finished, never exported nor acked: deleted
    sessions: list[str] = field(default_factory=list)  # orphan gateway sessions: deleted (or given a TTL)
    keys: int = 0  # Redis keys deleted (or given a TTL) for both, both servers together
    index_dropped: int = 0  # index entries of tasks whose keys had expired
    dirs_pruned: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"tasks": len(self.tasks), "sessions": len(self.sessions), "keys": self.keys,
                "index_dropped": self.index_dropped, "dirs_pruned": self.dirs_pruned}


def _batches(items: Any, size: int) -> Any:
    batch: list[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def collect(r: redis.Redis, keys: Keys, *, retention: float, now: float | None = None,
            gw: redis.Redis | None = None, sessions_dir: str | None = None, dry_run: bool = False,
            batch: int = 500, session_limit: int = 1000) -> Collected:
    """The janitor's pass. (a) Every finished task (its group has `finished_at`) finished more
    than `retention` seconds ago that was neither exported nor acked (no export mark, no TTL, no
    `acked_at`) is deleted with every key it owns (`drop_task`); index entries of tasks whose
    keys expired leave the indexes. Unfinished tasks are never touched: only a finished group has
    `finished_at`. (b) `collect_orphan_sessions` with `idle = retention`, up to `session_limit`."""
    now = now or time.time()
    out = Collected()
    if retention <= 0:
        return out
    cutoff = now - retention
    gone: list[str] = []
    for chunk in _batches(r.zscan_iter(keys.task_index(), count=batch), batch):
        tids = [replies.text(raw) or "" for raw, _ in chunk]
        pipe = r.pipeline(transaction=False)
        for t in tids:
            pipe.exists(keys.task(t))
            pipe.exists(keys.task_exported(t))
            pipe.ttl(keys.task(t))
            pipe.hmget(keys.group(t), "finished_at", "acked_at")
        answers = pipe.execute()
        for i, t in enumerate(tids):
            exists, exported, ttl, (finished_at, acked_at) = answers[4 * i: 4 * i + 4]
            if not exists:
                gone.append(t)
            elif exported or acked_at is not None or ttl >= 0 or finished_at is None:
                continue  # expiring on its own, or not finished
            elif float(finished_at) <= cutoff:
                n = 1 if dry_run else drop_task(r, keys, t, gw, scan=False)
                if n:  # 0: another pass (one that outlived its lock) took it first
                    out.tasks.append(t)
                    out.keys += 0 if dry_run else n
    out.index_dropped = len(gone)
    if not dry_run:
        _forget(r, keys, gone)
        if sessions_dir and (out.tasks or gone):
            out.dirs_pruned = prune_task_dirs(Path(sessions_dir), out.tasks + gone)
    out.sessions, n = collect_orphan_sessions(r, keys, idle=retention, now=now, gw=gw, dry_run=dry_run,
                                              limit=session_limit, scan=False)
    out.keys += n
    return out


def _last_activity(g: redis.Redis, keys: Keys, session: GatewaySession) -> float:
    """When the session was last used: its creation, or the end of its last stored call."""
    last = float(session.created_at or 0.0)
    blob = replies.blob(g.lindex(keys.calls(session.session_id), -1))
    if blob:
        try:
            env = record_codec.envelope(blob) or unpack(blob)
            last = max(last, float(env.get("started_at") or 0.0) + float(env.get("latency_ms") or 0.0) / 1000.0)
        except Exception:  # noqa: BLE001 - an unreadable record: the session counts as used now
            last = time.time()
    return last


def collect_orphan_sessions(r: redis.Redis, keys: Keys, *, idle: float, now: float | None = None,
                            gw: redis.Redis | None = None, ttl: float = 0.0, dry_run: bool = False,
                            limit: int = 1000, scan: bool = True) -> tuple[list[str], int]:
    """Gateway sessions no task owns (no `task_id`, or its task is gone from the pipeline's Redis
    `r`) whose last activity (creation, or the end of their last stored call; never one with a
    call in flight) is more than `idle` seconds ago: every key of theirs (`_gateway_keys`: record,
    key mapping, records, chunks, in-flight and cancel flags, trajectories) deleted (`ttl` 0) or
    given `ttl`. Candidates come from the sessions index, oldest known activity first; a session
    found in use or owned moves to its activity time, so each is looked at once per `idle`. The
    delete is a transaction WATCHing the session's record, calls and in-flight hash: a call that
    lands meanwhile keeps the session. Returns (session ids, keys)."""
    g = gw if gw is not None else r
    now = now or time.time()
    index = keys.gateway_sessions_index()
    done: list[str] = []
    nkeys = 0
    for raw in g.zrangebyscore(index, "-inf", now - idle, start=0, num=limit):
        sid = replies.text(raw) or ""
        if g.hlen(keys.session_inflight(sid)):
            LostCalls(g, keys).reap(sid)  # calls of a dead gateway process end as records first
        watched = [keys.gateway_session(sid), keys.calls(sid), keys.session_inflight(sid)]
        with g.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(*watched)
                blob = replies.blob(pipe.get(keys.gateway_session(sid)))
                session = GatewaySession.from_dict(unpack(blob)) if blob else None
                if session is not None and session.task_id and r.exists(keys.task(session.task_id)):
                    last = now  # a task's: its retention is the task's (look again in `idle`)
                elif session is not None and int(pipe.hlen(keys.session_inflight(sid))):
                    last = now
                elif session is not None:
                    last = _last_activity(g, keys, session)
                else:
                    last = 0.0  # its record is gone (expired with its task): what is left goes
                if last > now - idle:
                    pipe.unwatch()
                    if not dry_run:
                        g.zadd(index, {sid: last}, xx=True)
                    continue
                if session is not None and ttl > 0 and pipe.ttl(keys.gateway_session(sid)) >= 0:
                    pipe.unwatch()
                    continue  # expiring already
                found = _existing(g, _gateway_keys(g, keys, sid, scan))
                if dry_run:
                    pipe.unwatch()
                else:
                    pipe.multi()
                    for k in found:
                        if ttl > 0:
                            pipe.expire(k, max(1, int(ttl)))
                        else:
                            pipe.delete(k)
                    if ttl <= 0 or session is None:
                        pipe.zrem(index, sid)
                    pipe.execute()
            except redis.WatchError:
                continue  # used meanwhile: kept, looked at again next pass
        if session is not None or found:
            done.append(sid)
            nkeys += len(found)
    return done, nkeys


def index_gateway_sessions(g: redis.Redis, keys: Keys) -> int:
    """Put gateway sessions created before the sessions index existed into it (a SCAN of the
    whole keyspace: `polar-mq gc` runs it, the janitor does not). Returns how many were added."""
    added = 0
    prefix = keys.gateway_session("")
    for batch in _batches(g.scan_iter(match=prefix + "*", count=1000), 500):
        sids = [(replies.text(k) or "")[len(prefix):] for k in batch]
        blobs = [replies.blob(b) for b in g.mget([keys.gateway_session(s) for s in sids])]
        entries: dict[str, float] = {}
        for sid, blob in zip(sids, blobs):
            if blob:
                entries[sid] = float(GatewaySession.from_dict(unpack(blob)).created_at or time.time())
        if entries:
            added += int(g.zadd(keys.gateway_sessions_index(), entries, nx=True) or 0)  # type: ignore[arg-type]
    return added


def memory(r: redis.Redis) -> dict[str, int]:
    """Redis memory figures for /metrics (INFO memory)."""
    info = r.info("memory")
    return {k: int(info.get(k) or 0) for k in ("used_memory", "used_memory_rss", "used_memory_peak",
                                                "maxmemory", "used_memory_dataset")}
