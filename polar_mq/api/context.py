"""What the request handlers share: settings, the Redis client, the pipeline store, Celery."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import redis
from redis import Redis
from flask import current_app

from polar_mq.store.pipeline import PipelineStore
from polar_mq.settings import PipelineSettings
from polar_mq.store.core import Keys

EXTENSION = "polar_mq"


@dataclass
class ApiContext:
    settings: PipelineSettings
    redis: redis.Redis
    store: PipelineStore
    _celery: Any = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _gateway_redis: Redis | None = None

    @property
    def keys(self) -> Keys:
        return self.store.keys

    @property
    def gateway_redis(self) -> Redis | None:
        """The gateway's own Redis (settings.gateway_redis_url), or None when it shares ours."""
        url = self.settings.gateway_redis_url
        if not url or url == self.settings.redis_url:
            return None
        if self._gateway_redis is None:
            with self._lock:
                if self._gateway_redis is None:
                    from polar_mq.store.core import connect

                    self._gateway_redis = connect(url)
        return self._gateway_redis

    @property
    def celery(self) -> Any:
        """The Celery app used to enqueue stage tasks (created on first use)."""
        if self._celery is None:
            with self._lock:
                if self._celery is None:
                    from polar_mq.tasks.app.celery import make_celery

                    self._celery = make_celery(self.settings)
        return self._celery

    def stage_context(self):
        """A stage context whose messages go through this API's Celery app."""
        from polar_mq.tasks.app.context import GatewayClient, StageContext
        from polar_mq.tasks.app.routing import make_enqueue

        return StageContext(settings=self.settings, store=self.store,
                            gateway=GatewayClient(self.settings.gateway_url, self.settings.gateway_token),
                            enqueue=make_enqueue(lambda *a, **kw: self.celery.send_task(*a, **kw), self.store))

    def enqueued_key(self, task_id: str) -> str:
        """Marks a task whose init messages were all handed to the broker."""
        return self.keys.task_enqueued(task_id)


def ctx() -> ApiContext:
    return current_app.extensions[EXTENSION]
