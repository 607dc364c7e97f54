"""Calls of a dead gateway process end as exactly one `gateway_lost` record (store/lost_calls.py),
against a real redis-server: the in-flight entry names its gateway, the gateway's alive key
decides, and racing reapers (threads and processes' worth of clients) write one record."""

from __future__ import annotations

import threading
import time
import uuid

import redis

from polar_mq.model import GATEWAY_LOST, CaptureRecord
from polar_mq.proxy_app.admission import Admission
from polar_mq.store.core import GatewayStore, Keys
from polar_mq.store.pause import PauseState


def _store(redis_url: str) -> GatewayStore:
    return GatewayStore(redis.Redis.from_url(redis_url), Keys(f"lost{uuid.uuid4().hex[:6]}"))


def test_a_dead_gateways_call_ends_once_and_a_live_ones_stays(redis_url):
    store = _store(redis_url)
    session, _ = store.create_session("s-lost")
    sid = session.session_id
    pause = PauseState(store.r, store.keys)
    live, dead = "hostA:11:aaaaaa", "hostA:12:bbbbbb"
    pause.heartbeat(live, {}, alive_ttl=30)
    pause.heartbeat(dead, {}, alive_ttl=0.2)
    t0 = time.time()
    Admission(store.r, store.keys, live).enter(sid, "call-live", t0, provider="anthropic")
    Admission(store.r, store.keys, dead).enter(sid, "call-dead", t0 + 0.001, provider="anthropic")
    store.append_call(CaptureRecord(session_id=sid, provider="anthropic", call_id="call-ok"))
    assert store.inflight_calls(sid) == 2  # the dead one's key has not expired yet
    time.sleep(0.3)

    # Eight reapers at once (postrun's wait and GET /sessions/<id> on several hosts): one record.
    clients = [_store(redis_url) for _ in range(8)]
    for c in clients:
        c.keys = store.keys
        c.lost.keys = store.keys
    counts: list[int] = []
    barrier = threading.Barrier(len(clients))

    def reap(c: GatewayStore) -> None:
        barrier.wait()
        counts.append(len(c.lost.reap(sid)))

    threads = [threading.Thread(target=reap, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(counts) == 1, counts
    assert store.inflight_calls(sid) == 1  # the live gateway's call is still in flight
    n, calls = store.inflight_and_calls(sid)
    assert n == 1
    lost = [c for c in calls if c.call_id == "call-dead"]
    assert len(lost) == 1 and lost[0].status == "error" and lost[0].error.startswith(GATEWAY_LOST)
    assert dead in lost[0].error and lost[0].provider == "anthropic"
    assert abs(lost[0].started_at - (t0 + 0.001)) < 1e-6
    assert not any(c.call_id == "call-live" for c in calls)

    # The live gateway goes away cleanly (forget): its call is lost at the next count.
    pause.forget(live)
    assert store.inflight_calls(sid) == 0
    assert sorted(c.call_id for c in store.calls(sid) if c.status == "error") == ["call-dead", "call-live"]


def test_a_reaper_never_ends_a_call_its_gateway_finished_meanwhile(redis_url):
    """The compare-and-set: an entry that changed (the call left flight and a new one took the
    id) or a gateway that beat again is left alone."""
    store = _store(redis_url)
    sid = store.create_session("s-cas")[0].session_id
    gid = "hostB:13:cccccc"
    Admission(store.r, store.keys, gid).enter(sid, "call-x", time.time())
    [(call_id, entry, raw)] = store.lost.find(sid)  # never beat: dead
    PauseState(store.r, store.keys).heartbeat(gid, {}, alive_ttl=30)  # ... and it beats now
    assert store.lost.reap(sid) == [] and store.r.hexists(store.keys.session_inflight(sid), "call-x")
    assert entry.gateway_id == gid and call_id == "call-x"


def test_entries_without_a_gateway_are_never_judged(redis_url):
    store = _store(redis_url)
    sid = store.create_session("s-old")[0].session_id
    store.r.hset(store.keys.session_inflight(sid), "call-old", repr(time.time()))
    assert store.inflight_calls(sid) == 1 and store.calls(sid) == []


def test_the_janitor_ends_a_dead_gateways_call_of_an_orphan_session(redis_url):
    """An orphan session (no task) whose only call was in flight on a gateway process that died: the
    janitor's orphan pass (store/retention.py collect_orphan_sessions) ends the call as its
    `gateway_lost` record first, so the session is no longer "in use" for ever, and collects it once
    idle; a session with a live gateway's call in flight is never collected."""
    from polar_mq.store import retention

    store = _store(redis_url)
    pause = PauseState(store.r, store.keys)
    dead, live = "hostB:21:cccccc", "hostB:22:dddddd"
    pause.heartbeat(dead, {}, alive_ttl=0.2)
    pause.heartbeat(live, {}, alive_ttl=30)
    lost_sid = store.create_session(f"o-{uuid.uuid4().hex[:8]}")[0].session_id
    busy_sid = store.create_session(f"o-{uuid.uuid4().hex[:8]}")[0].session_id
    t0 = time.time()
    Admission(store.r, store.keys, dead).enter(lost_sid, "call-dead", t0, provider="openai_chat")
    Admission(store.r, store.keys, live).enter(busy_sid, "call-live", t0, provider="openai_chat")
    time.sleep(0.3)
    # without the reap its in-flight entry would keep the session "in use" for ever
    got, _ = retention.collect_orphan_sessions(store.r, store.keys, idle=60, now=time.time() + 3600)
    assert lost_sid in got and not store.r.exists(store.keys.gateway_session(lost_sid))
    assert busy_sid not in got and store.r.exists(store.keys.gateway_session(busy_sid))
    assert store.r.hlen(store.keys.session_inflight(busy_sid)) == 1
