"""Stage hand-offs written as kombu's Redis transport writes them, without Celery's `send_task`.

Why: `send_task` runs routing, option merging, message building, kombu's producer and channel,
then one LPUSH, and that Python around the LPUSH costs about ten times the LPUSH itself
(bench/bench_dispatch.py; figures in docs/benchmarks.md). `StageMessages` builds the same
message (tests/pipeline/test_publish.py) — Celery's task protocol 2 headers
and properties, the msgpack body base64-encoded, the JSON envelope kombu's Redis transport LPUSHes
onto the queue's list — and LPUSHes it with the stage's own Redis client (which rides out a Redis
restart like Celery's publish retries). Workers read it as any other message; the janitor finds it
by the session id in `argsrepr` (recovery.py).

Used only where it is the same thing: a `redis://` broker on the stages' Redis, msgpack, no
task-sent events (Flower's `POLAR_TASK_EVENTS=1` keeps `send_task`, which publishes them), no
priorities or key prefixes in the transport options. `sender()` returns `send_task` otherwise.
"""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any, Callable

import msgpack
import redis
from celery.utils.nodenames import anon_nodename
from celery.utils.saferepr import saferepr

from polar_mq.tasks.app.priority import level_list

_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
_SAFE_TRANSPORT_OPTIONS = {"visibility_timeout", "unacked_restore_interval"}


class StageMessages:
    def __init__(self, app: Any, r: redis.Redis):
        self.app = app
        self.r = r
        self.origin = anon_nodename()
        self.reply_to = str(app.thread_oid)

    def message(self, name: str, args: list[Any], queue: str, priority: int = 0) -> str:
        """The JSON kombu's Redis transport stores for `send_task(name, args=args, queue=queue)`."""
        task_id = str(uuid.uuid4())
        root_id, parent_id = task_id, None
        parent = self.app.current_worker_task
        if parent is not None:  # as send_task does inside a task
            root_id = parent.request.root_id or parent.request.id
            parent_id = parent.request.id
        body = msgpack.packb([list(args), {}, _EMBED], use_bin_type=True)
        argsrepr = repr(list(args))
        if len(argsrepr) > self.app.amqp.argsrepr_maxsize:  # a callback's body: Celery's cut
            argsrepr = saferepr(list(args), self.app.amqp.argsrepr_maxsize,
                                maxlevels=self.app.conf.task_repr_maxlevels)
        return json.dumps({
            "body": base64.b64encode(body).decode("ascii"),
            "content-encoding": "binary",
            "content-type": "application/x-msgpack",
            "headers": {
                "lang": "py", "task": name, "id": task_id, "shadow": None, "eta": None, "expires": None,
                "group": None, "group_index": None, "retries": 0, "timelimit": [None, None],
                "root_id": root_id, "parent_id": parent_id, "argsrepr": argsrepr, "kwargsrepr": "{}",
                "origin": self.origin, "ignore_result": None, "replaced_task_nesting": 0,
                "stamped_headers": None, "stamps": {},
            },
            "properties": {
                "correlation_id": task_id, "reply_to": self.reply_to, "delivery_mode": 2,
                "delivery_info": {"exchange": "", "routing_key": queue}, "priority": priority,
                "body_encoding": "base64", "delivery_tag": str(uuid.uuid4()),
            },
        })

    def send_task(self, name: str, args: list[Any], queue: str, priority: int = 0) -> None:
        # Level 0: the queue's own list; another level its list beside it (tasks/priority.py).
        self.r.lpush(level_list(queue, priority), self.message(name, args, queue, priority))


def applies(app: Any, redis_url: str) -> bool:
    """Whether a message built here is exactly what `app.send_task` would publish."""
    conf = app.conf
    options = set(conf.broker_transport_options or {})
    return (str(conf.broker_url or "") == redis_url and redis_url.startswith(("redis://", "unix://"))
            and conf.task_serializer == "msgpack" and conf.task_protocol == 2
            and not conf.task_send_sent_event and options <= _SAFE_TRANSPORT_OPTIONS
            and not conf.task_default_priority and not conf.task_inherit_parent_priority)


def sender(app: Any, r: redis.Redis, redis_url: str) -> Callable[..., object]:
    """`send(name, args=[...], queue=...)` for the stages' hand-offs (routing.make_enqueue)."""
    return StageMessages(app, r).send_task if applies(app, redis_url) else app.send_task
