"""Recovery that the broker cannot do alone: messages held by dead workers, runtimes on dead hosts.

1. Held messages. kombu's Redis transport keeps every delivered-but-unacked message in the
   `unacked` hash and redelivers it only after the visibility timeout (hours: agent sessions run
   for minutes, a shorter timeout would deliver live sessions again). A live holder of a stage
   message always holds the session's lease within moments of receiving it (stages take it first
   thing), so a message older than a lease TTL whose session has no lease, is still in a state that
   stage accepts and has been quiet for a TTL, belongs to a dead worker: it is put back at the head
   of its queue. A false positive is only a duplicate delivery, which stages skip. Messages whose
   session moved on are dropped from the hash (their stage would skip them anyway).
2. Dead hosts. A session whose runtime lives on a node that stopped beating is prepared again on
   another host (READY/RUNNING → INITIALIZING, a new attempt, a fresh gateway session).

Tests: tests/pipeline/test_fencing_recovery.py, tests/pipeline/test_many_hosts.py.
"""

from __future__ import annotations

import base64
import json
import logging
import time
from typing import Any

import msgpack

from polar_mq import states
from polar_mq.store import replies
from polar_mq.model import SessionRecord
from polar_mq.tasks.app.routing import INIT_TASK, POSTRUN_TASK, RUN_TASK
from polar_mq.tasks.app.priority import level_list, queue_lists
from polar_mq.tasks.app.context import StageContext
from polar_mq.tasks.worker.leftovers import file_leftover

log = logging.getLogger("polar_mq.recovery")

UNACKED = "unacked"  # kombu's defaults (transport options unacked_key / unacked_index_key)
UNACKED_INDEX = "unacked_index"
ACCEPTS = {
    INIT_TASK: {states.REGISTERED, states.INITIALIZING},
    RUN_TASK: {states.READY, states.RUNNING},
    POSTRUN_TASK: {states.POST_RUN, states.BUILDING, states.EVALUATING},
}
RUNTIME_BOUND = {states.READY, states.RUNNING}

# Put a held message back at the consuming end of its queue (kombu BRPOPs from the right), once.
_RESTORE = """
local blob = redis.call('HGET', KEYS[1], ARGV[1])
if not blob then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
if ARGV[2] ~= '' then redis.call('RPUSH', ARGV[2], ARGV[3]) end
return 1
"""


def decode_held(blob: bytes) -> tuple[dict[str, Any], str, str | None]:
    """(kombu payload, task name, first argument) of an `unacked` hash entry."""
    payload, _exchange, routing_key = json.loads(blob)
    headers = payload.get("headers") or {}
    body = payload.get("body", "")
    if (payload.get("properties") or {}).get("body_encoding") == "base64":
        body = base64.b64decode(body)
    if payload.get("content-type") == "application/x-msgpack":
        args = msgpack.unpackb(body, raw=False)[0]
    else:
        args = json.loads(body)[0]
    payload["_queue"] = routing_key
    return payload, headers.get("task", ""), (args[0] if args else None)


def holder_dead(rec: SessionRecord | None, task_name: str, has_lease: bool, now: float, ttl: float) -> bool:
    if rec is None or task_name not in ACCEPTS or rec.state not in ACCEPTS[task_name]:
        return False
    return not has_lease and now - rec.updated_at >= ttl


def restore_held_messages(ctx: StageContext) -> list[str]:
    """One pass over messages delivered more than a TTL ago. Returns the restored session ids."""
    r, store, ttl = ctx.store.r, ctx.store, ctx.settings.lease_ttl
    now = time.time()
    script = r.register_script(_RESTORE)
    restored = []
    for tag in replies.texts(r.zrangebyscore(UNACKED_INDEX, "-inf", now - ttl)):
        blob = replies.blob(r.hget(UNACKED, tag))
        if blob is None:
            r.zrem(UNACKED_INDEX, tag)
            continue
        try:
            payload, task_name, sid = decode_held(blob)
        except Exception:  # not ours to judge
            continue
        if task_name not in ACCEPTS or not isinstance(sid, str):
            continue
        rec = store.get_session(sid)
        if rec is None or rec.state not in ACCEPTS[task_name]:
            script(keys=[UNACKED, UNACKED_INDEX], args=[tag, "", ""])  # stale: its stage would skip
            continue
        if not holder_dead(rec, task_name, store.lease_holder(sid) is not None, now, ttl):
            continue
        queue = level_list(payload.pop("_queue"), int((payload.get("properties") or {}).get("priority") or 0))
        payload.setdefault("headers", {})["redelivered"] = True
        if script(keys=[UNACKED, UNACKED_INDEX], args=[tag, queue, json.dumps(payload)]):
            log.warning("restored %s for %s (held by a dead worker) to %s", task_name, sid, queue)
            store.incr("messages_restored")
            restored.append(sid)
    return restored


def runtime_lost(ctx: StageContext, rec: SessionRecord, live_queues: set[str] | None = None,
                 nodes: dict[str, float] | None = None) -> bool:
    """The session's runtime lives on a node that is gone, or that no longer runs a run pool (so
    nothing there will ever run it). `nodes`: the node table (node -> liveness expiry) read for a
    whole sweep, else read here."""
    from polar_mq.tasks.app.routing import node_queue

    host = rec.runtime_host
    if rec.state not in RUNTIME_BOUND or host is None:
        return False
    live = ctx.store.live_queues() if live_queues is None else live_queues
    alive = ctx.store.node_alive(host) if nodes is None else nodes.get(host, 0.0) > time.time()
    return not alive or node_queue("run", host) not in live


def reinitialise(ctx: StageContext, rec: SessionRecord) -> bool:
    """Prepare the session again elsewhere: a new attempt, a fresh gateway session next time."""
    abandoned = rec.stats.get("abandoned_gateway_sessions", [])
    if rec.gateway_session_id:
        abandoned = abandoned + [rec.gateway_session_id]
    new = ctx.store.transition(
        rec.session_id, states.INITIALIZING, expect={rec.state}, attempt=rec.attempt + 1,
        runtime=None, workdir=None, gateway_session_id=None, gateway_key=None, base_urls={},
        stats={**rec.stats, "abandoned_gateway_sessions": abandoned,
               "lost_runtimes": rec.stats.get("lost_runtimes", []) + [rec.runtime_host]})
    if new is None:
        return False
    file_leftover(ctx.store, rec.session_id, rec.runtime)  # its host tears it down when back (leftovers.py)
    ctx.store.take_ready(rec.session_id)  # out of the READY list, its slot freed
    log.warning("session %s: runtime host %s is gone; re-initialising (attempt %d)",
                rec.session_id, rec.runtime_host, new.attempt)
    ctx.store.incr("sessions_reinitialised")
    ctx.enqueue(INIT_TASK, rec.session_id)
    return True


WAITING: dict[str, str] = {states.REGISTERED: INIT_TASK, states.READY: RUN_TASK, states.POST_RUN: POSTRUN_TASK}


def resend_missing_messages(ctx: StageContext, recs: list[SessionRecord], now: float) -> list[str]:
    """Sessions waiting for a stage whose message exists nowhere (a publish lost in a Redis
    outage, a worker that died between its state change and its hand-off): send it again. A
    message is found by the session id in its `argsrepr` header, in the stage's queues or in the
    unacked hash. Only sessions quiet for 2 TTLs without a lease are checked, so this is rare."""
    from polar_mq.tasks.app.routing import STAGE_QUEUE, queue_for

    r, ttl = ctx.store.r, ctx.settings.lease_ttl
    quiet = [rec for rec in recs if rec.state in WAITING and now - rec.updated_at >= 2 * ttl]
    leased = ctx.store.leases_held([rec.session_id for rec in quiet])
    candidates = [rec for rec in quiet if rec.session_id not in leased]
    if not candidates:
        return []
    held = replies.texts(r.hvals(UNACKED), errors="replace")
    queued: dict[str, list[str]] = {}
    resent = []
    for rec in candidates:
        name = WAITING[rec.state]
        queues = {queue_for(ctx.store, name, rec.session_id), STAGE_QUEUE[name]}
        for q in queues - queued.keys():  # every dispatch_priority level's list (priority.py)
            with r.pipeline(transaction=False) as pipe:
                for key in queue_lists(q):
                    pipe.lrange(key, 0, -1)
                queued[q] = [m for got in pipe.execute() for m in replies.texts(got, errors="replace")]
        if any(rec.session_id in m for q in queues for m in queued[q]) or any(rec.session_id in m for m in held):
            continue
        log.warning("session %s in %s has no %s message anywhere; sending it again", rec.session_id,
                    rec.state, name)
        ctx.store.incr("messages_resent")
        ctx.enqueue(name, rec.session_id)
        resent.append(rec.session_id)
    return resent
