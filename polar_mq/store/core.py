"""Redis layout and msgpack encoding: the one place that knows key names.

Gateway sessions, their keys and their capture records live here; later stages (API, workers)
add their own keys to `Keys` rather than spelling key strings elsewhere.

Tests: tests/store/test_storage.py, tests/gateway/test_deferred_store.py.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from typing import Any, Callable, Iterable

import msgpack
import redis

from polar_mq.store import codec as record_codec
from polar_mq.store import replies
from polar_mq._io.locks import short_lock
from polar_mq.model import CaptureRecord, GatewaySession, Trajectory
from polar_mq.store.lost_calls import LostCalls, entry_value
from polar_mq.store.wire import PipelineWire, RedisWire, Wire


class Keys:
    """Every Redis key polar_mq uses, under one prefix."""

    def __init__(self, prefix: str = "pmq"):
        self.prefix = prefix

    def gateway_key(self, key: str) -> str:
        return f"{self.prefix}:gw:key:{key}"

    def gateway_session(self, session_id: str) -> str:
        return f"{self.prefix}:gw:session:{session_id}"

    def calls(self, session_id: str) -> str:
        return f"{self.prefix}:gw:calls:{session_id}"

    def call_chunks(self, session_id: str) -> str:
        """Content-addressed chunks (messages, body pieces, id blocks) of a session's records."""
        return f"{self.prefix}:gw:chunks:{session_id}"

    def session_inflight(self, session_id: str) -> str:
        """Calls of a session the gateway is still working on (call id ->
        `<admitted at>|<gateway id>|<provider>`: store/lost_calls.py)."""
        return f"{self.prefix}:gw:inflight:{session_id}"

    def gateway_alive(self, gateway_id: str) -> str:
        """Set with a short TTL by each live gateway process (store/pause.py heartbeat): gone, its
        calls in flight are lost (store/lost_calls.py)."""
        return f"{self.prefix}:gw:alive:{gateway_id}"

    def session_cancelled(self, session_id: str) -> str:
        """Set when nobody wants the session's generations any more: the gateway aborts them."""
        return f"{self.prefix}:gw:cancel:{session_id}"

    def gateway_sessions_index(self) -> str:
        """ZSET gateway session id -> the last activity the janitor knows of (created_at at
        first): where the janitor finds gateway sessions idle past the retention (retention.py)."""
        return f"{self.prefix}:gw:sessions"

    def gateway_session_keys(self, session_id: str) -> list[str]:
        """Every key of one gateway session except its key -> id mapping (which needs the key)."""
        return [self.gateway_session(session_id), self.calls(session_id), self.call_chunks(session_id),
                self.session_inflight(session_id), self.session_cancelled(session_id),
                self.trajectory(session_id, "per_request"), self.trajectory(session_id, "prefix_merging")]

    def trajectory(self, session_id: str, builder: str) -> str:
        return f"{self.prefix}:traj:{session_id}:{builder}"

    def gateway_paused(self) -> str:
        return f"{self.prefix}:gw:paused"

    def token_text(self, model: str) -> str:
        """Hash: token id → its text for one served model (viewers show every recorded id)."""
        return f"{self.prefix}:gw:toktext:{model}"

    # --- rollout pipeline -----------------------------------------------------------------------
    def task(self, task_id: str) -> str:
        return f"{self.prefix}:task:{task_id}"

    def task_sessions(self, task_id: str) -> str:
        return f"{self.prefix}:task:{task_id}:sessions"

    def task_cancelled(self, task_id: str) -> str:
        return f"{self.prefix}:task:{task_id}:cancelled"

    def task_enqueued(self, task_id: str) -> str:
        """Set once every init message of a task was handed to the broker (a resubmit finishes
        enqueueing a task whose marker is missing)."""
        return f"{self.prefix}:task:{task_id}:enqueued"

    def task_index(self) -> str:
        return f"{self.prefix}:tasks"

    def session(self, session_id: str) -> str:
        return f"{self.prefix}:session:{session_id}"

    def lease(self, session_id: str) -> str:
        return f"{self.prefix}:lease:{session_id}"

    def active_sessions(self) -> str:
        """Sessions that are not terminal: the janitor scans these for dead leases."""
        return f"{self.prefix}:sessions:active"

    def ready(self) -> str:
        return f"{self.prefix}:ready"

    def ready_slots(self) -> str:
        return f"{self.prefix}:ready:slots"

    def ready_wakeup(self) -> str:
        return f"{self.prefix}:ready:wakeup"

    def janitor_lock(self) -> str:
        return f"{self.prefix}:janitor"

    def ready_capacity(self) -> str:
        return f"{self.prefix}:ready:capacity"

    def callbacks_done(self, task_id: str) -> str:
        return f"{self.prefix}:task:{task_id}:callback"

    def task_exported(self, task_id: str) -> str:
        """Set when a finished task's results were exported or acked: its retention runs from then."""
        return f"{self.prefix}:task:{task_id}:exported"

    def task_keys(self, task_id: str) -> list[str]:
        return [self.task(task_id), self.task_sessions(task_id), self.task_cancelled(task_id),
                self.callbacks_done(task_id), self.task_exported(task_id), self.task_terminal(task_id),
                self.group(task_id), self.task_callbacks(task_id), self.task_enqueued(task_id),
                f"{self.prefix}:task:{task_id}:early_stopped"]  # tasks/early_stop.py

    def session_keys(self, session_id: str) -> list[str]:
        return [self.session(session_id), self.lease(session_id), self.trajectory(session_id, "result")]

    def task_callbacks(self, task_id: str) -> str:
        """Hash: callback delivery id -> its delivery state (JSON), shown in the task status."""
        return f"{self.prefix}:task:{task_id}:callbacks"

    def counter(self) -> str:
        return f"{self.prefix}:metrics"

    # --- scoped API tokens (roles.py) ------------------------------------------------------------
    def api_token(self, digest: str) -> str:
        """Hash of one scoped token, keyed by the sha256 of the token (never the token): name,
        role, created_at, expires_at. Expires with the token (Redis TTL)."""
        return f"{self.prefix}:auth:token:{digest}"

    def api_token_names(self) -> str:
        """Hash: token name -> JSON {role, digest, created_at, expires_at} (`polar-mq token list`)."""
        return f"{self.prefix}:auth:names"

    # --- groups for trainers (group_queue.py) ----------------------------------------------------
    def task_terminal(self, task_id: str) -> str:
        """Sessions of a task that reached a terminal state (the group is done when all are)."""
        return f"{self.prefix}:task:{task_id}:terminal"

    def group(self, task_id: str) -> str:
        """Hash: finished_at, delivery, leased_until, acked_at, ack_reason."""
        return f"{self.prefix}:group:{task_id}"

    def group_prefix(self) -> str:
        return f"{self.prefix}:group:"

    def groups_pending(self) -> str:
        """ZSET task_id → finished_at: finished groups ready to hand out, oldest first."""
        return f"{self.prefix}:groups:pending"

    def groups_leased(self) -> str:
        """ZSET task_id → lease expiry: groups handed out and not acked yet."""
        return f"{self.prefix}:groups:leased"

    def groups_wakeup(self) -> str:
        return f"{self.prefix}:groups:wakeup"

    # --- weight versions and the cluster-wide pause (proxy_app/pause.py, api/admin.py) ------------
    def policy_version(self) -> str:
        return f"{self.prefix}:gw:policy_version"

    def gateway_inflight_by_gateway(self) -> str:
        """Hash gateway id → generations in flight there (the admin pause drains the live ones)."""
        return f"{self.prefix}:gw:inflight:by_gateway"

    def gateway_heartbeats(self) -> str:
        """ZSET gateway id → last heartbeat (unix time)."""
        return f"{self.prefix}:gw:heartbeats"

    def gateway_info(self) -> str:
        """Hash gateway id → JSON {upstreams, host, pid, started_at}."""
        return f"{self.prefix}:gw:gateways"

    def upstream_weights(self) -> str:
        """Hash upstream URL → JSON of what its RL API last reported (weight version, paused)."""
        return f"{self.prefix}:gw:upstream_weights"

    def histogram(self, name: str) -> str:
        """Hash of one Prometheus histogram observed by many processes (histograms.py)."""
        return f"{self.prefix}:hist:{name}"


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def unpack(blob: bytes) -> Any:
    return msgpack.unpackb(blob, raw=False, strict_map_key=False)


class StoreUnavailable(Exception):
    """Redis could not be reached; callers turn this into a 503, never a silent loss."""


def _guard(fn):
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise StoreUnavailable(f"redis unavailable: {exc}") from exc

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


def connect(url: str, *, ride_out_outages: float = 0.0) -> redis.Redis:
    """A Redis client for any URL redis_url.client accepts (Sentinel included). The gateway uses short timeouts (it must answer 503 quickly when Redis is
    down); workers pass `ride_out_outages` seconds to retry through a Redis restart instead."""
    from polar_mq.store.redis_url import client

    if ride_out_outages <= 0:
        return client(url, socket_connect_timeout=2, socket_timeout=5, health_check_interval=30)
    from redis.backoff import ExponentialBackoff
    from redis.retry import Retry

    retries = max(1, int(ride_out_outages / 1.0))
    return client(url, socket_connect_timeout=2, socket_timeout=10, health_check_interval=10,
                  retry=Retry(ExponentialBackoff(cap=1.0, base=0.1), retries),
                  retry_on_error=[redis.ConnectionError, redis.TimeoutError])


class KnownChunks:
    """Digests this process stored, for the sessions it wrote to last (bounded: LRU)."""

    def __init__(self, max_sessions: int = 512):
        self.max_sessions = max_sessions
        self._by_session: OrderedDict[str, set[bytes]] = OrderedDict()
        self._lock = short_lock()

    def get(self, session_id: str, default: set[bytes]) -> set[bytes]:
        """The session's set itself, for reading only (codec.Encoder only asks `in`): a copy per
        call would cost time in proportion to the session's length. Digests only join it once
        Redis confirmed them stored, so one that
        joins while an encoder reads is as good to rely on as the others."""
        with self._lock:
            known = self._by_session.get(session_id)
            if known is None:
                return default
            self._by_session.move_to_end(session_id)
            return known

    def add(self, session_id: str, digests: set[bytes]) -> None:
        with self._lock:
            self._by_session.setdefault(session_id, set()).update(digests)
            self._by_session.move_to_end(session_id)
            while len(self._by_session) > self.max_sessions:
                self._by_session.popitem(last=False)

    def pop(self, session_id: str, default: Any = None) -> Any:
        with self._lock:
            return self._by_session.pop(session_id, default)


# KEYS: session record, key mapping of the new key, the sessions index. ARGV: record, session
# id, created_at. Answers nil when created, else the record that already exists (its key mapping
# untouched).
_CREATE_SESSION = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX') then
  redis.call('SET', KEYS[2], ARGV[2])
  redis.call('ZADD', KEYS[3], ARGV[3], ARGV[2])
  return false
end
return redis.call('GET', KEYS[1])
"""


class Commands(list):
    """Redis commands queued for one MULTI (what `GatewayStore._write` sends, and what its `also`
    callers add), as argument tuples."""

    def exists(self, key: str) -> None:
        self.append(("EXISTS", key))

    def hsetnx(self, key: str, field: Any, value: Any) -> None:
        self.append(("HSETNX", key, field, value))

    def rpush(self, key: str, value: Any) -> None:
        self.append(("RPUSH", key, value))

    def hdel(self, key: str, field: Any) -> None:
        self.append(("HDEL", key, field))

    def eval(self, script: str, numkeys: int, *keys_and_args: Any) -> None:
        self.append(("EVAL", script, numkeys, *keys_and_args))


class GatewayStore:
    """Sessions, session keys and capture records."""

    def __init__(self, client: redis.Redis, keys: Keys | None = None, wire: Wire | None = None):
        self.r = client
        # how per-call commands travel: RedisWire in the gateway, redis-py pipelines elsewhere
        self.wire: Wire = wire if wire is not None else PipelineWire(client)
        self.keys = keys or Keys()
        self._known = KnownChunks()
        self._create = self.r.register_script(_CREATE_SESSION)
        self.lost = LostCalls(self.r, self.keys)

    @_guard
    def ping(self) -> bool:
        return bool(self.r.ping())

    @_guard
    def create_session(self, session_id: str, task_id: str | None = None,
                       metadata: dict[str, Any] | None = None,
                       sampling: dict[str, Any] | None = None) -> tuple[GatewaySession, bool]:
        """Create a session (or return the existing one with that id). Returns (session, created)."""
        session = GatewaySession(session_id=session_id, key="pmq-" + secrets.token_urlsafe(24),
                                 task_id=task_id, metadata=metadata or {}, sampling=sampling or {})
        # One round trip (was three: GET, SET NX, SET key): NX on the session record makes
        # concurrent creations of one id agree on a single key, and its key mapping is written in
        # the same step, so a session is never stored without it.
        existing = self._create(keys=[self.keys.gateway_session(session_id), self.keys.gateway_key(session.key),
                                      self.keys.gateway_sessions_index()],
                                args=[pack(session.to_dict()), session_id, session.created_at])
        if existing is not None:
            return GatewaySession.from_dict(unpack(existing)), False
        return session, True

    @_guard
    def get_session(self, session_id: str) -> GatewaySession | None:
        blob = replies.blob(self.r.get(self.keys.gateway_session(session_id)))
        return GatewaySession.from_dict(unpack(blob)) if blob else None

    @_guard
    def resolve_key(self, key: str) -> str | None:
        """Session id for a session key, or None for an unknown key."""
        return replies.text(self.r.get(self.keys.gateway_key(key)))

    def _write(self, records: list[CaptureRecord], trust_cache: bool = True,
               also: Callable[[Any], None] | None = None) -> int:
        """Chunks (HSETNX: each stored once per session) and envelopes in one MULTI, so a reader
        never sees an envelope whose chunks are not there yet. Chunks this process stored before
        are not sent again; if the session's chunk hash vanished meanwhile (collected), the write
        is redone in full. `also` adds the writer's own commands to the same MULTI
        (proxy_app/admission.py); it is given a `Commands` list."""
        return self._send(records, trust_cache, also).finish()

    def _send(self, records: list[CaptureRecord], trust_cache: bool = True,
              also: Callable[[Any], None] | None = None) -> "RecordWrite":
        """`_write` up to its MULTI being sent (on the RedisWire; through a redis-py pipeline it
        is also answered): RecordWrite.finish reads the answer and completes it."""
        writes: list[tuple[str, dict[bytes, bytes], str, bytes]] = []
        relied: list[str] = []
        used: dict[str, set[bytes]] = {}
        for rec in records:
            known = self._known.get(rec.session_id, set()) if trust_cache else set()
            blob, chunks, refs = record_codec.encode(rec, record_codec.Encoder(known))
            key = self.keys.call_chunks(rec.session_id)
            if refs - set(chunks) and key not in relied:
                relied.append(key)
            writes.append((key, chunks, self.keys.calls(rec.session_id), blob))
            used.setdefault(rec.session_id, set()).update(refs)
        cmds = Commands()
        for key in relied:  # first in the MULTI: do the chunks relied upon still exist?
            cmds.exists(key)
        for key, chunks, calls_key, blob in writes:
            for digest, stored in chunks.items():
                cmds.hsetnx(key, digest, stored)
            cmds.rpush(calls_key, blob)
        if also is not None:
            also(cmds)
        return RecordWrite(self, records, relied, used, sent=self.wire.send_transaction(cmds))

    def _transaction(self, cmds: "Commands") -> list[Any]:
        """One MULTI/EXEC on the store's wire. Replies in order; a command's error reply raises
        (ResponseError) after the others ran, as a redis-py pipeline does."""
        return _raise_errors(self.wire.transaction(cmds))

    @_guard
    def send_call(self, record: CaptureRecord, also: Callable[[Any], None] | None = None) -> "RecordWrite":
        """`append_call` sent, not yet answered: the caller can do other work (answer its client)
        while Redis runs the MULTI, then must call `finish()` on the result."""
        return self._send([record], also=also)

    @_guard
    def append_call(self, record: CaptureRecord, also: Callable[[Any], None] | None = None) -> None:
        """`also` queues more commands on the record's MULTI (one round trip for all of them)."""
        self._write([record], also=also)

    @_guard
    def calls(self, session_id: str) -> list[CaptureRecord]:
        pipe = self.r.pipeline(transaction=True)
        pipe.lrange(self.keys.calls(session_id), 0, -1)
        pipe.hgetall(self.keys.call_chunks(session_id))
        blobs, chunks = pipe.execute()
        return self._decode_calls(blobs, chunks)

    @_guard
    def call_blobs_since(self, session_id: str, start: int) -> tuple[int, list[bytes]]:
        """(how many records the session has, the stored blobs of those from position `start`
        on), read at one moment: token-in matching (tito/index.py) reads only the new ones."""
        key = self.keys.calls(session_id)
        pipe = self.r.pipeline(transaction=True)
        pipe.llen(key)
        pipe.lrange(key, start, -1)
        length, blobs = pipe.execute()
        return int(length), list(blobs)

    @_guard
    def chunks(self, session_id: str, digests: Iterable[bytes]) -> dict[bytes, bytes]:
        """Stored chunks of a session by digest (the ones Redis has)."""
        wanted = list(digests)
        if not wanted:
            return {}
        found = self.r.hmget(self.keys.call_chunks(session_id), wanted)
        return {d: v for d, v in zip(wanted, map(replies.blob, found)) if v is not None}

    @_guard
    def call_at(self, session_id: str, index: int) -> CaptureRecord | None:
        """The record at position `index` of the session's list, whole (two round trips: its
        blob, then the chunks it refers to); None when there is none."""
        blob = replies.blob(self.r.lindex(self.keys.calls(session_id), index))
        if blob is None:
            return None
        env = record_codec.envelope(blob)
        chunks = self.chunks(session_id, record_codec.references(env)) if env is not None else {}
        return record_codec.decode(blob, chunks)

    @_guard
    def inflight_and_calls(self, session_id: str) -> tuple[int, list[CaptureRecord]]:
        """`inflight_calls` and `calls` read at one moment, in one round trip (postrun's wait
        for a session's last calls, then its read, were two per session). Calls in flight on a
        gateway process that died are ended first (`gateway_lost` records: store/lost_calls.py)."""
        for _ in range(2):
            pipe = self.r.pipeline(transaction=True)
            pipe.hlen(self.keys.session_inflight(session_id))
            pipe.lrange(self.keys.calls(session_id), 0, -1)
            pipe.hgetall(self.keys.call_chunks(session_id))
            inflight, blobs, chunks = pipe.execute()
            if not inflight or not self.lost.reap(session_id):
                break
        return int(inflight), self._decode_calls(blobs, chunks)

    @staticmethod
    def _decode_calls(blobs: list[bytes], chunks: dict[bytes, bytes]) -> list[CaptureRecord]:
        reader = record_codec.ChunkReader(chunks)
        records = [record_codec.decode(b, reader) for b in blobs]
        records.sort(key=lambda rec: rec.started_at)
        return records

    @_guard
    def append_calls(self, records: Iterable[CaptureRecord]) -> int:
        return self._write(list(records), trust_cache=False)

    # --- in-flight calls and cancellation (postrun waits; cancelled sessions abort upstream) ----
    @_guard
    def call_started(self, session_id: str, call_id: str, gateway_id: str | None = None) -> bool:
        """Register a call in flight unless its session is cancelled (one round trip); returns
        False, registering nothing, for a cancelled session. `gateway_id`: the process holding it
        (its death ends the call: store/lost_calls.py)."""
        key = self.keys.session_inflight(session_id)
        pipe = self.r.pipeline(transaction=False)
        pipe.exists(self.keys.session_cancelled(session_id))
        pipe.hset(key, call_id, entry_value(time.time(), gateway_id) if gateway_id else repr(time.time()))
        pipe.expire(key, 24 * 3600)
        cancelled = pipe.execute()[0]
        if cancelled:
            self.r.hdel(key, call_id)
        return not cancelled

    @_guard
    def call_finished(self, session_id: str, call_id: str) -> None:
        self.r.hdel(self.keys.session_inflight(session_id), call_id)

    @_guard
    def inflight_calls(self, session_id: str) -> int:
        """The session's calls in flight, after ending those of dead gateway processes (as
        `inflight_and_calls`)."""
        n = int(self.r.hlen(self.keys.session_inflight(session_id)))
        if n and self.lost.reap(session_id):
            n = int(self.r.hlen(self.keys.session_inflight(session_id)))
        return n

    @_guard
    def cancel_session(self, session_id: str, ttl: float = 7 * 24 * 3600) -> None:
        self.r.set(self.keys.session_cancelled(session_id), b"1", ex=int(ttl))

    @_guard
    def is_session_cancelled(self, session_id: str) -> bool:
        return bool(self.r.exists(self.keys.session_cancelled(session_id)))

    @_guard
    def cancelled_sessions(self, session_ids: list[str]) -> set[str]:
        if not session_ids:
            return set()
        # the call watcher asks 4 times a second: one round trip on the store's wire
        hits = _raise_errors(self.wire.run([("EXISTS", self.keys.session_cancelled(sid)) for sid in session_ids]))
        return {sid for sid, hit in zip(session_ids, hits) if hit}

    @_guard
    def session_bytes(self, session_id: str) -> int:
        """Redis memory of one gateway session (MEMORY USAGE, exact), its key mapping included."""
        session = self.get_session(session_id)
        keys = self.keys.gateway_session_keys(session_id)
        if session is not None:
            keys.append(self.keys.gateway_key(session.key))
        total = 0
        for key in keys:
            total += int(self.r.memory_usage(key, samples=0) or 0)
        return total

    @_guard
    def save_trajectory(self, trajectory: Trajectory) -> None:
        self.r.set(self.keys.trajectory(trajectory.session_id, trajectory.builder),
                   pack(trajectory.to_dict()))


def _raise_errors(results: list[Any]) -> list[Any]:
    for reply in results:
        if isinstance(reply, redis.ResponseError):
            raise reply
    return results


class RecordWrite:
    """Records whose MULTI was sent (GatewayStore.send_call); `finish()` reads its answer,
    stores the chunks again when the ones it relied on were collected meanwhile, and remembers
    what this process stored. Redis errors raise StoreUnavailable, as from `append_call`."""

    def __init__(self, store: GatewayStore, records: list[CaptureRecord], relied: list[str],
                 used: dict[str, set[bytes]], *, results: list[Any] | None = None, sent: Any = None):
        self.store, self.records, self.relied, self.used = store, records, relied, used
        self._results, self._sent = results, sent

    @_guard
    def finish(self) -> int:
        store, relied = self.store, self.relied
        results = self._results
        if results is None:
            sent, self._sent = self._sent, None
            results = _raise_errors(RedisWire.exec_replies(sent.replies()))
        if relied and not all(results[:len(relied)]):
            for sid in self.used:
                store._known.pop(sid, None)
            # The envelopes landed; store every chunk they refer to again (HSETNX keeps the rest).
            again = Commands()
            for rec in self.records:
                _, chunks, _ = record_codec.encode(rec)
                for digest, stored in chunks.items():
                    again.hsetnx(store.keys.call_chunks(rec.session_id), digest, stored)
            store._transaction(again)
        for sid, refs in self.used.items():
            store._known.add(sid, refs)
        return len(self.records)

    @property
    def in_flight(self) -> bool:
        """Whether Redis's answer is still to be read (a redis-py pipeline has read it)."""
        return self._sent is not None and not self._sent.answered
