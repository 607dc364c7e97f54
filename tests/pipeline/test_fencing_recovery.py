"""Fencing and message recovery against a real Redis and real kombu messages (fast, no workers).

- a write fenced by a lease token is refused once the lease belongs to someone else;
- postrun cannot go back to POST_RUN (a late run write cannot restart it);
- a stage message held (delivered, unacked) by a worker that died is put back on its queue once
  its session has no lease and has been quiet for a TTL; a live holder's message is left alone.
"""

from __future__ import annotations

import time

import pytest

from polar_mq import states
from polar_mq.cli.embedded_redis import start_embedded
from polar_mq.store.pipeline import PipelineStore
from polar_mq.settings import PipelineSettings
from polar_mq.store.core import connect
from polar_mq.taskspec import parse_task
from polar_mq.tasks.app.celery import make_celery
from polar_mq.tasks.app.routing import RUN_TASK
from polar_mq.tasks.app.context import GatewayClient, StageContext
from polar_mq.tasks.worker.recovery import UNACKED, restore_held_messages


@pytest.fixture()
def redis_server():
    server = start_embedded()  # its own: the test looks at kombu's global unacked hash
    yield server
    server.stop()


def new_session(store: PipelineStore) -> str:
    task = parse_task({"instruction": "x", "num_samples": 1, "agent": {"harness": "shell",
                                                                       "options": {"command": "true"}}})
    return store.create_task(task)[0][0]


def test_stale_lease_token_cannot_write(redis_server):
    store = PipelineStore(connect(redis_server.url))
    sid = new_session(store)
    assert store.acquire_lease(sid, "old", 0.2)
    assert store.transition(sid, states.INITIALIZING, fence="old") is not None
    time.sleep(0.3)  # the old holder's lease lapses; a takeover holds it now
    assert store.acquire_lease(sid, "new", 10)
    assert store.transition(sid, states.READY, fence="old") is None
    assert store.get_session(sid).state == states.INITIALIZING
    assert store.transition(sid, states.READY, fence="new").state == states.READY


def test_postrun_never_returns_to_post_run(redis_server):
    store = PipelineStore(connect(redis_server.url))
    sid = new_session(store)
    for state in (states.INITIALIZING, states.READY, states.RUNNING, states.POST_RUN, states.BUILDING):
        assert store.transition(sid, state) is not None
    assert store.transition(sid, states.POST_RUN) is None
    assert store.transition(sid, states.INITIALIZING) is None


def test_message_held_by_a_dead_worker_goes_back_to_its_queue(redis_server):
    settings = PipelineSettings(redis_url=redis_server.url, lease_ttl=0.5)
    store = PipelineStore(connect(redis_server.url))
    ctx = StageContext(settings=settings, store=store, gateway=GatewayClient("http://127.0.0.1:9"),
                       enqueue=lambda *_: None, node="test")
    dead, alive = new_session(store), new_session(store)
    for sid in (dead, alive):
        for state in (states.INITIALIZING, states.READY):
            store.transition(sid, state)
    app = make_celery(settings)
    for sid in (dead, alive):
        app.send_task(RUN_TASK, args=[sid], queue="run@gone")
    # A consumer takes both messages and never acks: its process "dies" with them.
    conn = app.connection_for_read()
    channel = conn.default_channel
    held = [channel.basic_get("run@gone", no_ack=False) for _ in range(2)]
    assert all(held) and store.r.hlen(UNACKED) == 2 and store.r.llen("run@gone") == 0
    assert store.acquire_lease(alive, "live-holder", 30)  # this one's holder is alive
    assert restore_held_messages(ctx) == []  # too young: a holder takes its lease within moments
    time.sleep(0.6)
    assert restore_held_messages(ctx) == [dead]
    assert store.r.llen("run@gone") == 1 and store.r.hlen(UNACKED) == 1
    queued = store.r.lrange("run@gone", 0, -1)[0].decode()
    assert dead in queued and '"redelivered": true' in queued
    store.transition(alive, states.RUNNING)
    store.transition(alive, states.POST_RUN)
    assert restore_held_messages(ctx) == [] and store.r.hlen(UNACKED) == 0  # stale entry dropped
