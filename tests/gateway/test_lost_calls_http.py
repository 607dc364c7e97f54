"""A pipeline that does not share the gateway's Redis waits on `GET /sessions/<id>`'s
`inflight_calls` (tasks/app/context.py): that count ends the calls of a dead gateway process too
(store/lost_calls.py), so postrun's wait is not held by them."""

from __future__ import annotations

import time

import redis

from polar_mq.model import GATEWAY_LOST
from polar_mq.store.core import Keys
from polar_mq.store.lost_calls import entry_value


def _parent(pid: int) -> int | None:
    try:
        return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def test_get_session_ends_a_dead_gateways_call(gateway, session):
    r, keys = redis.Redis.from_url(gateway.redis_url), Keys()
    sid = session["session_id"]
    # a call admitted by a gateway process that is gone (it never beat, or its key expired)
    r.hset(keys.session_inflight(sid), "call-gone", entry_value(time.time(), "elsewhere:4242:abcdef", "openai_chat"))
    assert gateway.inflight(sid) == 0
    [lost] = [c for c in gateway.calls(sid) if c["call_id"] == "call-gone"]
    assert lost["status"] == "error" and lost["error"].startswith(GATEWAY_LOST)
    assert lost["provider"] == "openai_chat" and "elsewhere:4242:abcdef" in lost["error"]
    assert gateway.inflight(sid) == 0 and len([c for c in gateway.calls(sid) if c["call_id"] == "call-gone"]) == 1


def test_a_live_gateways_call_stays_in_flight(gateway, session):
    """The serving gateway's own process beats: a call it holds is never ended by a count."""
    r, keys = redis.Redis.from_url(gateway.redis_url), Keys()
    sid = session["session_id"]
    ids = [k.decode()[len(keys.gateway_alive("")):] for k in r.scan_iter(keys.gateway_alive("*"))]
    [gid] = [g for g in ids if _parent(int(g.rsplit(":", 2)[1])) == gateway.server.proc.pid]  # its worker
    r.hset(keys.session_inflight(sid), "call-live", entry_value(time.time(), gid))
    try:
        assert gateway.inflight(sid) == 1 and gateway.calls(sid) == []
    finally:
        r.hdel(keys.session_inflight(sid), "call-live")
