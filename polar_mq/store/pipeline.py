"""Durable pipeline state in Redis: tasks, sessions, leases, the bounded READY buffer, results.

Every state change goes through `transition`, an optimistic compare-and-set (one Lua script,
session_cas.py) checked against `states.ALLOWED` and the writer's fencing token, so duplicate or redelivered stage tasks cannot run a stage twice or move
a session backwards. Leases with heartbeats tell a live worker from a dead one.

Tests: tests/store/test_session_cas.py, tests/pipeline/test_pipeline.py, tests/pipeline/test_fencing_recovery.py.
"""

from __future__ import annotations

import json
import socket
import os
import time
import uuid
from typing import Any, Iterable

import redis

from polar_mq import states
from polar_mq.store import histograms
from polar_mq.store import replicated
from polar_mq.store import replies
from polar_mq.store import session_cas
from polar_mq.store import trajectory_codec
from polar_mq.store.groups import GroupQueue
from polar_mq.model import SessionRecord, Trajectory
from polar_mq.store.core import Keys, pack, unpack
from polar_mq.taskspec import TaskRequest, task_from_dict


KNOWN_RECORDS = 512  # records remembered per process (one per session a stage is working on)


def _evict_oldest(cache: dict) -> None:
    """Drop the oldest entry; a threads pool's slots share the cache, so another slot may change
    it between the look and the pop (losing an entry only costs a read)."""
    try:
        cache.pop(next(iter(cache)), None)
    except (StopIteration, RuntimeError):  # emptied, or changed size under the iterator
        pass


class Conflict(Exception):
    """A task id resubmitted with a different body."""


def node_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
# Take a READY slot for a session: never more sessions prepared-but-not-running than capacity.
_ACQUIRE_SLOT = """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then return 1 end
local cap = tonumber(redis.call('GET', KEYS[2]) or ARGV[2])
if redis.call('SCARD', KEYS[1]) < cap then
  redis.call('SADD', KEYS[1], ARGV[1])
  return 1
end
return 0
"""


# A stage's entry in one round trip: read the session, and only if its state is one the stage
# accepts take its lease (SET NX PX) and read its task's cancel flag. The state and task id are
# read with Redis' own msgpack decoder; a record it cannot decode answers 1 and the caller does
# the same steps one by one. KEYS: session, lease. ARGV: token, ttl ms, cancel-key prefix,
# cancel-key suffix, accepted states...
# Answers: {0} no session, {1, blob} decode here, {2, blob} state not accepted (no lease taken),
# {3, blob} lease held by another, {4, blob, cancelled} lease taken.
_ENTER = """
local blob = redis.call('GET', KEYS[1])
if not blob then return {0} end
local ok, rec = pcall(cmsgpack.unpack, blob)
if not ok or type(rec) ~= 'table' or type(rec.state) ~= 'string' or type(rec.task_id) ~= 'string' then
  return {1, blob}
end
local accepted = false
for i = 5, #ARGV do
  if rec.state == ARGV[i] then accepted = true end
end
if not accepted then return {2, blob} end
if not redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return {3, blob} end
return {4, blob, redis.call('EXISTS', ARGV[3] .. rec.task_id .. ARGV[4])}
"""


class StageEntry:
    """What `enter_stage` found: the record (None: no session), whether the stage may work on it
    (its state accepted and the lease taken), and the task's cancel flag at that moment."""

    def __init__(self, rec: SessionRecord | None, accepted: bool, leased: bool, cancelled: bool = False):
        self.rec, self.accepted, self.leased, self.cancelled = rec, accepted, leased, cancelled


# Into / out of the READY list, and the occupancy observed into its histogram (histograms.py
# layout, unlabelled) in the same step. KEYS: READY list, slots, wakeup, histogram.
# ARGV: session id, 'in' | 'out', the bucket bounds in order.
_READY_MOVE = session_cas.READY_MOVE_BODY


class PipelineStore:
    def __init__(self, client: redis.Redis, keys: Keys | None = None):
        self.r = client
        self.keys = keys or Keys()
        self._renew = self.r.register_script(_RENEW)
        self._release = self.r.register_script(_RELEASE)
        self._acquire_slot = self.r.register_script(_ACQUIRE_SLOT)
        self._cas = self.r.register_script(session_cas.SCRIPT)
        self._ready_script = self.r.register_script(_READY_MOVE)
        self._enter = self.r.register_script(_ENTER)
        self._known: dict[str, bytes] = {}  # session id -> the record last read or written here
        self._tasks: dict[str, TaskRequest] = {}
        self._live_queues: tuple[float, set[str]] = (0.0, set())
        self._nodes_seen: tuple[float, dict[str, float]] = (0.0, {})
        self.groups = GroupQueue(self.r, self.keys)

    # --- tasks ----------------------------------------------------------------------------------
    def create_task(self, task: TaskRequest, submitter: str | None = None) -> tuple[list[str], bool]:
        """Store a task and its sessions atomically. Returns (session ids, created).
        Same task id + same body → the existing sessions; different body → Conflict.
        `submitter`: the API token's name (roles.py), kept with the task; a task id another
        token submitted → Conflict (a resubmit never hands out another submitter's sessions)."""
        key = self.keys.task(task.task_id)
        fingerprint = task.fingerprint()
        while True:
            with self.r.pipeline() as pipe:
                try:
                    pipe.watch(key)
                    blob = replies.blob(pipe.get(key))
                    if blob is not None:
                        stored = unpack(blob)
                        pipe.unwatch()
                        if stored["fingerprint"] != fingerprint:
                            raise Conflict(f"task {task.task_id!r} exists with a different body")
                        if submitter is not None and stored.get("submitter", submitter) != submitter:
                            raise Conflict(f"task {task.task_id!r} was submitted by another token")
                        return self.session_ids(task.task_id), False
                    now = time.time()
                    sids = [f"{task.task_id}-{i}-{uuid.uuid4().hex[:8]}" for i in range(task.num_samples)]
                    pipe.multi()
                    stored_task = {"spec": task.to_dict(), "fingerprint": fingerprint, "created_at": now}
                    if submitter is not None:
                        stored_task["submitter"] = submitter
                    pipe.set(key, pack(stored_task))
                    pipe.rpush(self.keys.task_sessions(task.task_id), *sids)
                    pipe.zadd(self.keys.task_index(), {task.task_id: now})
                    for i, sid in enumerate(sids):
                        rec = SessionRecord(session_id=sid, task_id=task.task_id, index=i, created_at=now,
                                            updated_at=now, history=[[states.REGISTERED, now, None]])
                        pipe.set(self.keys.session(sid), pack(rec.to_dict()))
                        pipe.sadd(self.keys.active_sessions(), sid)
                    pipe.hincrby(self.keys.counter(), "tasks_submitted", 1)
                    pipe.hincrby(self.keys.counter(), "sessions_submitted", len(sids))
                    pipe.execute()
                    return sids, True
                except redis.WatchError:
                    continue

    def get_task(self, task_id: str) -> dict[str, Any] | None:
        blob = replies.blob(self.r.get(self.keys.task(task_id)))
        return unpack(blob) if blob else None

    def task_request(self, task_id: str) -> TaskRequest | None:
        stored = self.get_task(task_id)
        return task_from_dict(stored["spec"]) if stored else None

    def cached_task_request(self, task_id: str) -> TaskRequest | None:
        """`task_request`, parsed once per process: a task's body never changes (a resubmit with
        another body is a Conflict), so every stage of its sessions can use the same copy."""
        task = self._tasks.get(task_id)
        if task is None:
            task = self.task_request(task_id)
            if task is not None:
                if len(self._tasks) >= KNOWN_RECORDS:
                    _evict_oldest(self._tasks)
                self._tasks[task_id] = task
        return task

    def session_ids(self, task_id: str) -> list[str]:
        return replies.texts(self.r.lrange(self.keys.task_sessions(task_id), 0, -1))

    def list_tasks(self, limit: int = 100) -> list[str]:
        return replies.texts(self.r.zrevrange(self.keys.task_index(), 0, limit - 1))

    def cancel_task(self, task_id: str) -> None:
        self.r.set(self.keys.task_cancelled(task_id), 1)

    def is_cancelled(self, task_id: str) -> bool:
        return bool(self.r.exists(self.keys.task_cancelled(task_id)))

    # --- sessions -------------------------------------------------------------------------------
    def get_session(self, session_id: str) -> SessionRecord | None:
        blob = replies.blob(self.r.get(self.keys.session(session_id)))
        self._remember(session_id, blob)
        return SessionRecord.from_dict(unpack(blob)) if blob else None

    def known_session(self, session_id: str) -> SessionRecord | None:
        """The record this process last read or wrote (else a fresh read): for what does not change
        once set, e.g. the runtime's host when routing the next stage's message."""
        blob = self._known.get(session_id)
        if blob is None:
            return self.get_session(session_id)
        return SessionRecord.from_dict(unpack(blob))

    def get_sessions(self, session_ids: Iterable[str]) -> list[SessionRecord]:
        ids = list(session_ids)
        if not ids:
            return []
        blobs = [replies.blob(b) for b in self.r.mget([self.keys.session(s) for s in ids])]
        return [SessionRecord.from_dict(unpack(b)) for b in blobs if b]

    def transition(self, session_id: str, new_state: str | None, *, expect: Iterable[str] | None = None,
                   node: str | None = None, fence: str | None = None, release: bool = False,
                   ready: str = "", **fields: Any) -> SessionRecord | None:
        """Atomically move a session to `new_state` (None: update fields only) if allowed and, when
        given, if its current state is in `expect` and the session's lease still holds the token
        `fence` (the writer's lease: a worker whose lease lapsed can never write). Returns the new
        record, or None if refused.

        The decision is made here on a record read before (the one this process last wrote or
        read, else a fresh GET); the write is a compare-and-set in one script (session_cas.py)
        that also checks the fence. A record changed meanwhile comes back and is decided on again;
        a refusal made on a remembered record is re-checked on a fresh read first.

        With the write, in the same script: `release` drops the lease `fence` holds (a stage's
        last write); `ready` = 'in' / 'out' moves the session into / out of the READY list
        (push_ready / take_ready), each one round trip less."""
        expect = set(expect) if expect is not None else None
        blob = self._known.get(session_id)
        fresh = blob is None
        if fresh:
            blob = replies.blob(self.r.get(self.keys.session(session_id)))
        while True:
            if blob is None:
                self._known.pop(session_id, None)
                return None
            rec = SessionRecord.from_dict(unpack(blob))
            now = time.time()
            left = self._apply(rec, new_state, expect, node, fields, now)
            if left is None:  # refused on this record
                if not fresh:
                    blob, fresh = replies.blob(self.r.get(self.keys.session(session_id))), True
                    continue
                return None
            observation = histograms.fields(histograms.STAGE_SECONDS, left[1], left[0]) if left[0] else None
            new_blob = pack(rec.to_dict())
            terminal = new_state if new_state is not None and states.is_terminal(new_state) else None
            keys, args = session_cas.cas_call(
                self.keys, session_id=session_id, task_id=rec.task_id, expected=blob, new=new_blob, fence=fence,
                terminal_state=terminal, observation=observation,
                histogram_key=self.keys.histogram(histograms.STAGE_SECONDS.name), now=now,
                release=release, ready=ready,
                ready_histogram_key=self.keys.histogram(histograms.READY_OCCUPANCY.name),
                ready_buckets=tuple(histograms.READY_OCCUPANCY.buckets) if ready else ())
            answer = replicated.run_script(self.r, self._cas, keys, args, "session state change")
            if answer == 1:
                self._remember(session_id, None if terminal else new_blob)
                return rec
            if answer == 0:  # gone, or the fence no longer holds
                self._known.pop(session_id, None)
                return None
            blob, fresh = answer, True  # changed under us: decide again on the stored record

    @staticmethod
    def _apply(rec: SessionRecord, new_state: str | None, expect: set[str] | None, node: str | None,
               fields: dict[str, Any], now: float) -> tuple[str, float] | None:
        """Apply the move to `rec` in place; None if refused, else (state left or '', seconds in it)."""
        if expect is not None and rec.state not in expect:
            return None
        left: tuple[str, float] = ("", 0.0)
        if new_state is not None:
            if not states.can_move(rec.state, new_state):
                return None
            if new_state != rec.state:
                rec.timings.setdefault(f"{new_state.lower()}_start", now)
                rec.timings[f"{rec.state.lower()}_end"] = now
                started = rec.history[-1][1] if rec.history else rec.created_at
                left = (rec.state, max(0.0, now - float(started)))
            rec.state = new_state
            rec.history.append([new_state, now, node])
        for name, value in fields.items():
            setattr(rec, name, value)
        rec.node = node or rec.node
        rec.updated_at = now
        return left

    def _remember(self, session_id: str, blob: bytes | None) -> None:
        """Keep the record last seen of a few sessions: the next transition skips its read (the
        compare-and-set still checks it is current)."""
        self._known.pop(session_id, None)
        if blob is None:
            return
        if len(self._known) >= KNOWN_RECORDS:
            _evict_oldest(self._known)
        self._known[session_id] = blob

    def active_sessions(self) -> list[str]:
        return replies.texts(self.r.smembers(self.keys.active_sessions()))

    def enter_stage(self, session_id: str, accepts: Iterable[str], token: str, ttl: float) -> StageEntry:
        """A stage's first step in one round trip (not three: GET session, SET lease NX, EXISTS
        cancel flag): the record; if its state is in `accepts`, the lease taken for `token`
        (never taken for a state the stage skips); the task's cancel flag."""

        accepts = list(accepts)
        prefix, suffix = self.keys.task_cancelled("\0").split("\0")
        answer = self._enter(keys=[self.keys.session(session_id), self.keys.lease(session_id)],
                             args=[token, int(ttl * 1000), prefix, suffix, *accepts])
        code = int(answer[0])
        blob = answer[1] if code else None
        self._remember(session_id, blob)
        rec = SessionRecord.from_dict(unpack(blob)) if blob else None
        if code == 1 and rec is not None:  # not decodable by Redis' msgpack: step by step
            if rec.state not in accepts:
                return StageEntry(rec, False, False)
            if not self.acquire_lease(session_id, token, ttl):
                return StageEntry(rec, True, False)
            return StageEntry(rec, True, True, self.is_cancelled(rec.task_id))
        return StageEntry(rec, code >= 3, code == 4, code == 4 and bool(int(answer[2])))

    # --- leases (who is working on a session right now) -----------------------------------------
    def acquire_lease(self, session_id: str, token: str, ttl: float) -> bool:
        return bool(self.r.set(self.keys.lease(session_id), token, nx=True, px=int(ttl * 1000)))

    def renew_lease(self, session_id: str, token: str, ttl: float) -> bool:
        return bool(self._renew(keys=[self.keys.lease(session_id)], args=[token, int(ttl * 1000)]))

    def release_lease(self, session_id: str, token: str) -> None:
        self._release(keys=[self.keys.lease(session_id)], args=[token])

    def leases_held(self, session_ids: list[str]) -> set[str]:
        """Which of these sessions have a lease now (one MGET)."""
        if not session_ids:
            return set()
        held = self.r.mget([self.keys.lease(s) for s in session_ids])
        return {sid for sid, value in zip(session_ids, held) if value is not None}

    def lease_holder(self, session_id: str) -> str | None:
        return replies.text(self.r.get(self.keys.lease(session_id)))

    # --- nodes (which hosts are alive, what pools they run) -----------------------------------
    def beat_node(self, node: str, pool_id: str, info: dict[str, Any], ttl: float) -> None:
        """A pool on `node` is alive for `ttl` more seconds (`info`: stage, concurrency, queues)."""
        now = time.time()
        with self.r.pipeline(transaction=False) as pipe:
            pipe.hset(self._nodes_key(), node, now + ttl)
            pipe.hset(self._pools_key(), f"{node}|{pool_id}", pack({**info, "node": node, "seen": now,
                                                                   "expires": now + ttl}))
            pipe.execute()

    def node_alive(self, node: str, max_age: float = 0.0) -> bool:
        """`max_age` > 0 accepts the node table read that long ago (routing asks once per hand-off;
        a node counts as gone only after 2 lease TTLs without a beat, so a second is nothing)."""
        now = time.time()
        if max_age > 0:
            if now - self._nodes_seen[0] >= max_age:
                self._nodes_seen = (now, self.nodes())
            expires = self._nodes_seen[1].get(node)
            return expires is not None and expires > now
        value = self.r.hget(self._nodes_key(), node)
        return value is not None and float(value) > now

    def nodes(self) -> dict[str, float]:
        """node -> the time its liveness expires."""
        return {k: float(v) for k, v in replies.text_map(self.r.hgetall(self._nodes_key())).items()}

    def live_queues(self, max_age: float = 0.0) -> set[str]:
        """Queues some live pool consumes (e.g. `run@NODE`: that node can run what it prepares);
        `max_age` > 0 accepts an answer that old (read once a second, not once per session)."""
        now = time.time()
        if max_age > 0 and now - self._live_queues[0] < max_age:
            return self._live_queues[1]
        live = {q for p in self.pools() if p.get("expires", 0) > now for q in p.get("queues", [])}
        self._live_queues = (now, live)
        return live

    def pools(self) -> list[dict[str, Any]]:
        return [unpack(v) for v in replies.text_map(self.r.hgetall(self._pools_key())).values()]

    def forget_pools(self, older_than: float) -> None:
        """Drop pool entries that expired before `older_than` (the status view stays current)."""
        for field_, blob in replies.text_map(self.r.hgetall(self._pools_key())).items():
            if unpack(blob).get("expires", 0) < older_than:
                self.r.hdel(self._pools_key(), field_)

    def _nodes_key(self) -> str:
        return f"{self.keys.prefix}:nodes"

    def _pools_key(self) -> str:
        return f"{self.keys.prefix}:nodes:pools"

    # --- READY buffer ---------------------------------------------------------------------------
    def set_ready_capacity(self, capacity: int) -> None:
        self.r.set(self.keys.ready_capacity(), int(capacity))

    def ready_capacity(self, default: int) -> int:
        value = self.r.get(self.keys.ready_capacity())
        return int(value) if value else default

    def try_acquire_slot(self, session_id: str, default_capacity: int) -> bool:
        return bool(self._acquire_slot(keys=[self.keys.ready_slots(), self.keys.ready_capacity()],
                                       args=[session_id, default_capacity]))

    def release_slot(self, session_id: str) -> None:
        self.r.srem(self.keys.ready_slots(), session_id)

    def slots_held(self) -> list[str]:
        return replies.texts(self.r.smembers(self.keys.ready_slots()))

    def push_ready(self, session_id: str) -> None:
        """A prepared session enters READY (once), its occupancy observed, in one round trip."""
        self._ready_move(session_id, "in")

    def take_ready(self, session_id: str) -> None:
        """A run worker took the session: out of READY, its slot freed, a waiting init woken."""
        self._ready_move(session_id, "out")

    def _ready_move(self, session_id: str, way: str) -> None:
        spec = histograms.READY_OCCUPANCY
        self._ready_script(keys=[self.keys.ready(), self.keys.ready_slots(), self.keys.ready_wakeup(),
                                 self.keys.histogram(spec.name)],
                           args=[session_id, way, *(repr(float(b)) for b in spec.buckets)])

    def wait_for_slot(self, timeout: float) -> None:
        """Block until a slot may have been freed (or timeout): no busy polling while full."""
        self.r.blpop([self.keys.ready_wakeup()], timeout=timeout)

    def ready_list(self) -> list[str]:
        return replies.texts(self.r.lrange(self.keys.ready(), 0, -1))

    # --- results and metrics --------------------------------------------------------------------
    def save_trajectory(self, trajectory: Trajectory) -> None:
        """Stored compact (trajectory_codec: prompt ids as deltas of an earlier trace of the same
        value, repeated messages once, zlib); the readers below give back exactly `to_dict()`."""
        self.r.set(self.keys.trajectory(trajectory.session_id, "result"),
                   trajectory_codec.encode_dict(trajectory.to_dict()))

    def get_trajectory(self, session_id: str) -> Trajectory | None:
        blob = replies.blob(self.r.get(self.keys.trajectory(session_id, "result")))
        return Trajectory.from_dict(trajectory_codec.decode_dict(blob)) if blob else None

    def trajectory_blobs(self, session_ids: list[str]) -> list[bytes | None]:
        """The msgpack of each session's trajectory dict (None where there is none), in one
        round trip; the groups API splices these into its answer without decoding them again."""
        if not session_ids:
            return []
        blobs = [replies.blob(b) for b in self.r.mget([self.keys.trajectory(s, "result") for s in session_ids])]
        return [trajectory_codec.packed(b) if b is not None else None for b in blobs]

    def incr(self, name: str, amount: float = 1) -> None:
        self.r.hincrbyfloat(self.keys.counter(), name, amount)

    def counters(self) -> dict[str, float]:
        return {k: float(v) for k, v in replies.text_map(self.r.hgetall(self.keys.counter())).items()}

    def record_callback(self, task_id: str, delivery_id: str, state: dict[str, Any]) -> None:
        """The delivery state of one callback (delivered | retrying | dead_letter), for the status."""
        self.r.hset(self.keys.task_callbacks(task_id), delivery_id, json.dumps(state))
        self._follow_task_ttl(task_id, self.keys.task_callbacks(task_id))

    def _follow_task_ttl(self, task_id: str, key: str) -> None:
        """A key of a task written after its export or ack (a late callback) expires with the task
        (store/retention.py): no key outlives its task. tests/pipeline/test_janitor_retention.py."""
        ttl = int(self.r.pttl(self.keys.task(task_id)))
        if ttl > 0:
            self.r.pexpire(key, ttl)

    def callbacks(self, task_id: str) -> list[dict[str, Any]]:
        raw = self.r.hgetall(self.keys.task_callbacks(task_id))
        states_ = [json.loads(v) for v in raw.values()]
        return sorted(states_, key=lambda s: (s.get("created_at") or 0, s.get("delivery_id") or ""))

    def mark_callback_sent(self, task_id: str) -> bool:
        """True the first time only: the task callback fires once even if two sessions race."""
        first = bool(self.r.set(self.keys.callbacks_done(task_id), time.time(), nx=True))
        if first:
            self._follow_task_ttl(task_id, self.keys.callbacks_done(task_id))
        return first
