"""Groups for trainers: `GET /v1/groups/next` leases finished tasks, `POST .../ack` consumes them.

The queue itself (leases, redelivery, delivery counts) is `store.groups.GroupQueue` in Redis;
this module only validates the query and shapes a Group from the stored task, its sessions and
their trajectories.

Tests: tests/api/test_groups.py.
"""

from __future__ import annotations

import time
from typing import Any

import msgpack
from flask import Blueprint, Response, jsonify, request

from polar_mq import states
from polar_mq.store import retention
from polar_mq.store.groups import ACK_REASONS, Taken
from polar_mq.store.core import unpack
from polar_mq.tasks.app import early_stop
from polar_mq.api.context import ctx
from polar_mq.api.problems import Problem, not_found
from polar_mq.api.routes import _float_arg, _int_arg

bp = Blueprint("groups", __name__)

MAX_LIMIT = 1000
MAX_WAIT = 300.0  # long-poll cap; below the API's worker timeout
MAX_LEASE = 7 * 24 * 3600.0


def policy_version_of(metadata: dict[str, Any]) -> int | None:
    value = (metadata or {}).get("policy_version")
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


MSGPACK = "application/msgpack"


def build_group(taken: Taken, lease_expires_at: float | None = None) -> tuple[dict[str, Any], list[bytes]] | None:
    """A Group without its trajectories, plus the trajectories' stored msgpack blobs."""
    c = ctx()
    stored = c.store.get_task(taken.task_id)
    if stored is None:
        return None
    metadata = (stored.get("spec") or {}).get("metadata") or {}
    records = c.store.get_sessions(c.store.session_ids(taken.task_id))
    blobs = [b for b in c.store.trajectory_blobs([r.session_id for r in records]) if b is not None]
    info = c.store.groups.info(taken.task_id)
    stopped = early_stop.stopped(c.store, taken.task_id)  # sessions cancelled by early stop
    group = {
        "task_id": taken.task_id,
        "metadata": metadata,
        "policy_version": policy_version_of(metadata),
        "delivery": taken.delivery,
        "sessions": [{"session_id": r.session_id, "state": r.state, "reward": r.reward, "error": r.error,
                      "early_stopped": r.session_id in stopped} for r in records],
        "early_stopped": len(stopped),
        "trajectories": None,
        "finished_at": info.get("finished_at"),
        "lease_expires_at": lease_expires_at,
    }
    return group, blobs


def msgpack_body(groups: list[tuple[dict[str, Any], list[bytes]]]) -> bytes:
    """{"groups": [...]} as msgpack, each trajectory spliced in as stored (never decoded here)."""
    packer = msgpack.Packer(use_bin_type=True)
    out = [packer.pack_map_header(1), packer.pack("groups"), packer.pack_array_header(len(groups))]
    for group, blobs in groups:
        out.append(packer.pack_map_header(len(group)))
        for key, value in group.items():
            out.append(packer.pack(key))
            if key == "trajectories":
                out.append(packer.pack_array_header(len(blobs)))
                out.extend(blobs)
            else:
                out.append(packer.pack(value))
    return b"".join(out)


def wants_msgpack() -> bool:
    """JSON is the contract's shape; `Accept: application/msgpack` (or `?format=msgpack`) gets the
    same object as msgpack, several times cheaper for token-id lists (Client.groups uses it)."""
    return request.args.get("format") == "msgpack" or request.accept_mimetypes.best == MSGPACK


@bp.get("/v1/groups/next")
def next_groups() -> Response:
    c = ctx()
    limit = _int_arg("limit", 1, MAX_LIMIT)
    if limit == 0:
        raise Problem(400, "query parameter 'limit' must be at least 1", kind="validation-error", field="limit")
    wait = _float_arg("wait", minimum=0, maximum=MAX_WAIT) or 0.0
    lease = _float_arg("lease", minimum=0.001, maximum=MAX_LEASE)
    lease = 300.0 if lease is None else lease
    t0 = time.time()
    taken = c.store.groups.take_waiting(limit, lease, wait) if wait > 0 else c.store.groups.take(limit, lease)
    built = [g for g in (build_group(t, t0 + lease) for t in taken) if g is not None]
    if wants_msgpack():
        return Response(msgpack_body(built), mimetype=MSGPACK)
    groups = [{**g, "trajectories": [unpack(b) for b in blobs]} for g, blobs in built]
    return jsonify({"groups": groups})


@bp.post("/v1/groups/<task_id>/ack")
def ack(task_id: str) -> Response:
    c = ctx()
    body = request.get_json(silent=True) if request.get_data(cache=True).strip() else {}
    if not isinstance(body, dict):
        raise Problem(400, "body must be a JSON object (optional: {\"reason\": ...})", kind="validation-error",
                      field="body")
    reason = body.get("reason") or ""
    if reason not in ACK_REASONS:
        raise Problem(400, f"reason must be one of {', '.join(r for r in ACK_REASONS if r)}",
                      kind="validation-error", field="reason")
    if c.store.get_task(task_id) is None:
        raise not_found("task", task_id)
    result = c.store.groups.ack(task_id, reason)
    if result < 0:
        records = c.store.get_sessions(c.store.session_ids(task_id))
        done = sum(1 for r in records if states.is_terminal(r.state))
        raise Problem(409, f"task {task_id!r} is not finished ({done} of {len(records)} sessions terminal); "
                      "only a finished group can be acked", kind="group-not-finished", task_id=task_id)
    # Acked: the finished task's Redis data expires after the retention (retention.py).
    retention.mark_exported(c.redis, c.keys, task_id, c.settings.retention_seconds, gw=c.gateway_redis)
    return jsonify({"task_id": task_id, "acked": True, "already_acked": result == 0})


@bp.get("/v1/groups/stats")
def stats() -> Response:
    return jsonify(ctx().store.groups.stats())


@bp.get("/v1/groups/<task_id>")
def group_state(task_id: str) -> Response:
    """Where one group is in the queue (not leased: a read-only view)."""
    c = ctx()
    if c.store.get_task(task_id) is None:
        raise not_found("task", task_id)
    info = c.store.groups.info(task_id)
    state = ("acked" if "acked_at" in info else "leased" if info.get("leased_until", 0) > time.time()
             else "pending" if "finished_at" in info else "unfinished")
    return jsonify({"task_id": task_id, "state": state, **info})
