"""The Celery application: one queue per stage, msgpack, late acks, prefetch 1.

Task names and queues are routing.py's (one place for the API and the workers alike).
"""

from __future__ import annotations

from celery import Celery
from kombu import Queue

from polar_mq.settings import PipelineSettings
from polar_mq.tasks.app.routing import QUEUES, STAGE_QUEUE, INIT_TASK, task_routes


def make_celery(settings: PipelineSettings | None = None) -> Celery:
    settings = settings or PipelineSettings.from_env()
    from polar_mq.store.redis_url import celery_broker, is_sentinel

    broker = celery_broker(settings.redis_url)
    app = Celery("polar_mq", broker=broker.url, backend=None)
    if broker.use_ssl is not None:
        app.conf.broker_use_ssl = broker.use_ssl
    if settings.redis_url.startswith(("redis://", "rediss://", "unix://")):
        from polar_mq.tasks.app.broker import TRANSPORT

        app.conf.broker_transport = TRANSPORT  # survives a Redis restart (see broker.py)
    elif is_sentinel(settings.redis_url):
        from polar_mq.tasks.app.broker import SENTINEL_TRANSPORT

        app.conf.broker_transport = SENTINEL_TRANSPORT  # the same fixes, primary from Sentinel
    app.conf.update(
        task_queues=[Queue(q) for q in QUEUES],
        task_default_queue=STAGE_QUEUE[INIT_TASK],
        task_routes=task_routes(),
        task_serializer="msgpack",
        accept_content=["msgpack", "json"],
        result_serializer="msgpack",
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        worker_send_task_events=settings.task_events,  # for Flower (settings.task_events)
        task_send_sent_event=settings.task_events,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,  # ride out a Redis restart
        task_publish_retry=True,
        task_publish_retry_policy={"max_retries": 60, "interval_start": 0.2, "interval_step": 0.5,
                                   "interval_max": 2.0},
        broker_transport_options={
            "visibility_timeout": settings.visibility_timeout,
            # kombu scans unacked messages rarely by default (~100 s); leases do the fast path.
            "unacked_restore_interval": 5,
            **broker.transport_options,  # master_name, sentinel_kwargs (redis_url.celery_broker)
        },
    )
    app.conf.polar_settings = settings
    return app
