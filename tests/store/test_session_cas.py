"""The one-script session transition (polar_mq/store/session_cas.py) against a real Redis, no workers.

Two stores stand for two worker processes: each remembers the record it last wrote, so these
check that a remembered record never lets a stale decision through (the other process moved the
session, or the lease changed hands), that history and timings are exactly as before, and that a
terminal move's side effects (active set, READY slot, counters, group queue, stage histogram)
land with it.
"""

from __future__ import annotations

import pytest

from polar_mq import states
from polar_mq.store import histograms
from polar_mq.cli.embedded_redis import start_embedded
from polar_mq.store.pipeline import PipelineStore
from polar_mq.store.core import connect
from polar_mq.taskspec import parse_task


@pytest.fixture(scope="module")
def redis_server():
    server = start_embedded()
    yield server
    server.stop()


def new_sessions(store: PipelineStore, n: int = 1) -> list[str]:
    task = parse_task({"instruction": "x", "num_samples": n,
                       "agent": {"harness": "shell", "options": {"command": "true"}}})
    return store.create_task(task)[0]


def test_remembered_record_is_decided_again_when_another_process_moved_the_session(redis_server):
    a, b = PipelineStore(connect(redis_server.url)), PipelineStore(connect(redis_server.url))
    sid = new_sessions(a)[0]
    assert a.transition(sid, states.INITIALIZING, node="a").state == states.INITIALIZING
    # Process b moves it on; a still remembers INITIALIZING.
    assert b.transition(sid, states.READY, expect={states.INITIALIZING}, node="b").state == states.READY
    # a's decision on its remembered record (INITIALIZING → READY) is re-made on the stored one:
    # READY is not in `expect` → refused, nothing written.
    assert a.transition(sid, states.READY, expect={states.INITIALIZING}, node="a") is None
    # A move that is valid from the stored state goes through, on top of b's write.
    rec = a.transition(sid, states.RUNNING, expect={states.READY}, node="a")
    assert [h[0] for h in rec.history] == [states.REGISTERED, states.INITIALIZING, states.READY, states.RUNNING]
    assert [h[2] for h in rec.history] == [None, "a", "b", "a"]
    stored = b.get_session(sid)
    assert stored.history == rec.history and stored.timings == rec.timings
    assert set(rec.timings) == {"registered_end", "initializing_start", "initializing_end", "ready_start",
                                "ready_end", "running_start"}


def test_fence_is_checked_in_the_same_step_even_with_a_remembered_record(redis_server):
    store = PipelineStore(connect(redis_server.url))
    sid = new_sessions(store)[0]
    assert store.acquire_lease(sid, "old", 10)
    assert store.transition(sid, states.INITIALIZING, fence="old") is not None
    store.r.set(store.keys.lease(sid), "new")  # the lease changed hands (a takeover)
    assert store.transition(sid, None, fence="old", error="stale write") is None
    assert store.get_session(sid).error is None
    assert store.transition(sid, states.READY, fence="new").state == states.READY
    store.r.delete(store.keys.lease(sid))
    assert store.transition(sid, states.RUNNING, fence="new") is None  # no lease at all: refused


def test_terminal_move_side_effects_and_stage_histogram(redis_server):
    store = PipelineStore(connect(redis_server.url))
    hist = store.keys.histogram(histograms.STAGE_SECONDS.name)
    before = {k.decode(): float(v) for k, v in store.r.hgetall(hist).items()}
    sids = new_sessions(store, 2)
    task_id = store.get_session(sids[0]).task_id
    for sid in sids:
        for state in (states.INITIALIZING, states.READY):
            assert store.transition(sid, state) is not None
        assert store.try_acquire_slot(sid, 8)
        store.push_ready(sid)
    assert set(store.ready_list()) == set(sids)
    for state in (states.RUNNING, states.POST_RUN, states.BUILDING, states.EVALUATING, states.COMPLETED):
        assert store.transition(sids[0], state) is not None
    assert sids[0] not in store.active_sessions() and sids[0] not in store.slots_held()
    assert sids[0] not in store.ready_list()
    assert store.r.zscore(store.keys.groups_pending(), task_id) is None  # one session still running
    assert store.transition(sids[1], states.ERROR, error="x") is not None
    assert store.r.zscore(store.keys.groups_pending(), task_id) is not None  # last one: group queued
    assert store.transition(sids[1], states.COMPLETED) is None  # terminal stays terminal
    after = {k.decode(): float(v) for k, v in store.r.hgetall(hist).items()}
    moved = lambda f: after.get(f, 0) - before.get(f, 0)  # noqa: E731
    # Leaving REGISTERED twice, READY twice (one to RUNNING, one to ERROR), EVALUATING once.
    assert moved("REGISTERED|count") == 2 and moved("READY|count") == 2 and moved("EVALUATING|count") == 1
    counters = store.counters()
    assert counters["sessions_completed"] >= 1 and counters["sessions_error"] >= 1


def test_ready_occupancy_histogram_counts_every_move(redis_server):
    store = PipelineStore(connect(redis_server.url))
    hist = store.keys.histogram(histograms.READY_OCCUPANCY.name)
    store.r.delete(hist, store.keys.ready())
    sids = new_sessions(store, 3)
    for sid in sids:
        store.push_ready(sid)
    store.push_ready(sids[0])  # again: moved to the front, not duplicated
    store.take_ready(sids[1])
    raw = {k.decode(): float(v) for k, v in store.r.hgetall(hist).items()}
    # occupancies observed: 1, 2, 3, 3, then 2 after the take
    assert raw["|count"] == 5 and raw["|sum"] == 11
    assert raw["|1.0"] == 1 and raw["|2.0"] == 2 and raw["|4.0"] == 2
    assert store.ready_list().count(sids[0]) == 1 and sids[1] not in store.ready_list()


def test_stage_entry_takes_the_lease_only_for_an_accepted_state(redis_server):
    """PipelineStore.enter_stage: record, state check, lease and cancel flag in one round trip,
    with the answers of the former GET / SET NX / EXISTS steps."""
    store = PipelineStore(connect(redis_server.url))
    sid = new_sessions(store)[0]
    skipped = store.enter_stage(sid, {states.READY}, "t1", 10)  # a duplicate delivery: state moved on
    assert skipped.rec.state == states.REGISTERED and not skipped.accepted and not skipped.leased
    assert store.lease_holder(sid) is None  # no lease taken for a session the stage skips
    entry = store.enter_stage(sid, {states.REGISTERED, states.INITIALIZING}, "t1", 10)
    assert entry.accepted and entry.leased and not entry.cancelled
    assert store.lease_holder(sid) == "t1" and 9000 < store.r.pttl(store.keys.lease(sid)) <= 10000
    busy = store.enter_stage(sid, {states.REGISTERED}, "t2", 10)
    assert busy.accepted and not busy.leased and store.lease_holder(sid) == "t1"
    store.release_lease(sid, "t1")
    store.cancel_task(entry.rec.task_id)
    assert store.enter_stage(sid, {states.REGISTERED}, "t3", 10).cancelled
    assert store.enter_stage("no-such-session", {states.REGISTERED}, "t4", 10).rec is None
    # The record read is remembered: the next transition needs no read of its own.
    assert store.transition(sid, states.INITIALIZING, fence="t3").state == states.INITIALIZING


def test_last_write_drops_the_lease_and_ready_moves_land_with_the_state(redis_server):
    """transition(release=True) drops the writer's lease in the same step (only with its own
    fence); ready='in'/'out' does what push_ready/take_ready did, occupancy observed."""
    store = PipelineStore(connect(redis_server.url))
    sid = new_sessions(store)[0]
    hist = store.keys.histogram(histograms.READY_OCCUPANCY.name)
    count0 = int(store.r.hget(hist, "|count") or 0)
    assert store.acquire_lease(sid, "tok", 10)
    store.transition(sid, states.INITIALIZING, fence="tok")
    assert store.try_acquire_slot(sid, 8)
    assert store.transition(sid, states.READY, fence="tok", ready="in", release=True) is not None
    assert store.lease_holder(sid) is None and sid in store.ready_list() and sid in store.slots_held()
    assert int(store.r.hget(hist, "|count")) == count0 + 1
    # A refused write (fence lost) releases nothing and moves nothing.
    store.r.set(store.keys.lease(sid), "other")
    assert store.transition(sid, states.RUNNING, fence="tok", ready="out", release=True) is None
    assert store.lease_holder(sid) == "other" and sid in store.ready_list()
    store.r.delete(store.keys.lease(sid))
    assert store.acquire_lease(sid, "run", 10)
    assert store.transition(sid, states.RUNNING, fence="run", ready="out").state == states.RUNNING
    assert sid not in store.ready_list() and sid not in store.slots_held() and store.lease_holder(sid) == "run"
    assert int(store.r.hget(hist, "|count")) == count0 + 2
    # An unfenced write never drops a lease.
    assert store.transition(sid, None, release=True, error=None) is not None and store.lease_holder(sid) == "run"
