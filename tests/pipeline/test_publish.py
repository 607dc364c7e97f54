"""Stage hand-offs built by polar_mq/tasks/app/publish.py are the messages Celery's `send_task`
publishes (same headers, properties and body, on the same Redis list), and real worker pools run
sessions end to end with them — and with `send_task` where Flower needs task-sent events."""

from __future__ import annotations

import base64
import json

import msgpack
import pytest
from kombu import Connection

from tests.support.pipeline import agent_task, make_pipeline
from polar_mq import states
from polar_mq.settings import PipelineSettings
from polar_mq.store.core import connect
from polar_mq.tasks.app.celery import make_celery
from polar_mq.tasks.app.publish import StageMessages, applies, sender
from polar_mq.tasks.worker.recovery import decode_held
from polar_mq.tasks.app.routing import CALLBACK_TASK, RUN_TASK


def _app(redis_url: str, events: bool = False):
    settings = PipelineSettings(redis_url=redis_url)
    settings.task_events = events
    return make_celery(settings)


def _body(payload: dict) -> list:
    return msgpack.unpackb(base64.b64decode(payload["body"]), raw=False)


@pytest.mark.parametrize("name, arg", [(RUN_TASK, "t-0-abc"), (CALLBACK_TASK, json.dumps({"x": "y" * 5000}))])
def test_the_message_is_what_send_task_publishes(redis_url, name, arg):
    app, r = _app(redis_url), connect(redis_url)
    queue = f"test-publish-{name}"
    r.delete(queue)
    app.send_task(name, args=[arg], queue=queue)
    StageMessages(app, r).send_task(name, args=[arg], queue=queue)
    theirs, ours = (json.loads(b) for b in r.lrange(queue, 0, -1)[::-1])  # LPUSH: oldest last
    r.delete(queue)
    assert ours.keys() == theirs.keys()
    assert ours["headers"].keys() == theirs["headers"].keys()
    assert ours["properties"].keys() == theirs["properties"].keys()
    for key in ("content-type", "content-encoding"):
        assert ours[key] == theirs[key]
    ids = {"id", "root_id", "parent_id"}
    assert {k: v for k, v in ours["headers"].items() if k not in ids} == \
        {k: v for k, v in theirs["headers"].items() if k not in ids}
    assert ours["headers"]["root_id"] == ours["headers"]["id"] and ours["headers"]["parent_id"] is None
    for key in ("delivery_info", "priority", "delivery_mode", "body_encoding", "reply_to"):
        assert ours["properties"][key] == theirs["properties"][key]
    assert ours["properties"]["correlation_id"] == ours["headers"]["id"]
    assert _body(ours) == _body(theirs) == [[arg], {}, {"callbacks": None, "errbacks": None, "chain": None,
                                                        "chord": None}]


def test_kombu_reads_it_and_the_janitor_finds_its_session(redis_url):
    app, r = _app(redis_url), connect(redis_url)
    queue = "test-publish-read"
    r.delete(queue)
    StageMessages(app, r).send_task(RUN_TASK, args=["t-1-def"], queue=queue)
    raw = r.lindex(queue, 0)
    payload, task, sid = decode_held(json.dumps([json.loads(raw), "", queue]).encode())
    assert (task, sid) == (RUN_TASK, "t-1-def")  # recovery.py reads held messages this way
    with Connection(redis_url, transport_options={"visibility_timeout": 60}) as conn:
        message = conn.SimpleQueue(queue, accept=["msgpack"]).get(timeout=5)  # as the Celery app accepts
        assert message.headers["task"] == RUN_TASK and message.decode()[0] == ["t-1-def"]
        message.ack()


def test_send_task_is_kept_where_it_is_not_the_same(redis_url):
    r = connect(redis_url)
    assert applies(_app(redis_url), redis_url)
    with_events = _app(redis_url, events=True)  # Flower: send_task also publishes task-sent events
    assert not applies(with_events, redis_url)
    assert sender(with_events, r, redis_url) == with_events.send_task
    prefixed = _app(redis_url)
    prefixed.conf.broker_transport_options = {**prefixed.conf.broker_transport_options, "global_keyprefix": "x:"}
    assert not applies(prefixed, redis_url)
    assert not applies(_app(redis_url), "redis://127.0.0.1:1/0")  # another Redis than the broker


@pytest.mark.parametrize("events", ["0", "1"])
def test_sessions_run_end_to_end_either_way(gateway, tmp_path, events):
    p = make_pipeline(gateway, tmp_path, POLAR_TASK_EVENTS=events)
    try:
        for stage in ("init", "run", "postrun"):
            p.start_worker(stage, 1)
        _, sids = p.submit(agent_task(num_samples=2))
        recs = p.wait(sids, timeout=90)
        assert [r.state for r in recs] == [states.COMPLETED] * 2
        assert all(r.reward == 1.0 and r.attempt == 0 for r in recs)
    finally:
        p.stop()
