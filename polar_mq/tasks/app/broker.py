"""The Redis broker transport with two fixes: a pool survives a Redis restart, and a channel
reuses its Redis client object instead of building one per operation.

When the broker connection drops, Celery closes the connection (kombu sets the transport's
`client` to None) and then closes the channel, whose QoS restores the unacknowledged messages
through a *new* client built from `transport.client.hostname`: `AttributeError: 'NoneType' object
has no attribute 'hostname'`, raised out of the consumer as an unrecoverable error (cf.
celery/kombu#970, #582), and the worker exits. The same happens when a task that was running
across the restart finishes and acks through its old, closed channel (`... attribute 'client'`). Here that restore is best effort: messages it cannot
restore stay in kombu's `unacked` hash, where the janitor's liveness check
(polar_mq/tasks/worker/recovery.py) hands them out again within a lease TTL.
"""

from __future__ import annotations

import logging

from contextlib import contextmanager

from kombu.transport import redis as kredis
from kombu.transport import virtual

from polar_mq.tasks.app.priority import LEVELS, consume_order

log = logging.getLogger("polar_mq.broker")


class QoS(kredis.QoS):
    def restore_unacked(self, client=None):
        try:
            return super().restore_unacked(client)
        except (AttributeError, *self.channel.connection_errors) as exc:
            log.warning("broker gone while restoring %d unacked message(s) (%r); they stay in the "
                        "unacked hash for the janitor", len(self._delivered), exc)
            self._delivered.clear()
            return None

    def ack(self, delivery_tag):
        try:
            super().ack(delivery_tag)
        except (AttributeError, *self.channel.connection_errors) as exc:
            self._forget(delivery_tag, exc)

    def reject(self, delivery_tag, requeue=False):
        try:
            super().reject(delivery_tag, requeue=requeue)
        except (AttributeError, *self.channel.connection_errors) as exc:
            self._forget(delivery_tag, exc)

    def _forget(self, delivery_tag, exc: BaseException) -> None:
        """An ack on a channel closed by a reconnect: drop it locally; the entry left in the
        unacked hash is dropped by the janitor once its session has moved on."""
        log.info("ack of %s on a closed channel (%r); left to the janitor", delivery_tag, exc)
        virtual.QoS.ack(self, delivery_tag)


class HigherFirst:
    """Message priorities as dispatch_priority orders them (tasks/priority.py): higher first.
    kombu's Redis channel takes the lowest level first and levels 0..9 only; here a message's
    level is -9..9 (0: the queue's own list, as without priorities) and BRPOP names the levels
    highest first. Mixed into every Redis channel class the stages use."""

    min_priority = -LEVELS
    max_priority = LEVELS
    priority_steps = consume_order()

    def priority(self, n):
        return max(-LEVELS, min(LEVELS, int(n or 0)))


class Channel(HigherFirst, kredis.Channel):
    """kombu builds a new `redis.Redis` for every publish, every delivery's unacked entry and every
    ack (`conn_or_acquire`), all on the channel's one connection pool; with redis-py 5+ that
    constructor (its response-callback tables) is a large share of a pool's main process and of
    a stage's publish (bench/bench_dispatch.py). One client per channel and pool does the
    same: connections still come from the pool per command, and a pool replaced after a
    reconnect gets a new client."""

    QoS = QoS
    _sync_client: tuple[object, object] | None = None

    @contextmanager
    def conn_or_acquire(self, client=None):
        if client:
            yield client
            return
        pool = self.pool
        cached = self._sync_client
        if cached is None or cached[0] is not pool:
            cached = self._sync_client = (pool, self._create_client())
        yield cached[1]


class Transport(kredis.Transport):
    Channel = Channel


TRANSPORT = f"{__name__}:Transport"


class SentinelChannel(Channel, kredis.SentinelChannel):
    """Channel's fixes on kombu's Sentinel channel: the pool asks the Sentinels for the primary
    on every new connection, so a reconnect after a failover lands on the new one."""


class SentinelTransport(kredis.SentinelTransport):
    Channel = SentinelChannel


SENTINEL_TRANSPORT = f"{__name__}:SentinelTransport"
