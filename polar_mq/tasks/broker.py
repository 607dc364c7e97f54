"""The Redis broker transport with one fix: a pool survives a Redis restart.

When the broker connection drops, Celery closes the connection (kombu sets the transport's
`client` to None) and then closes the channel, whose QoS restores the unacknowledged messages
through a *new* client built from `transport.client.hostname`: `AttributeError: 'NoneType' object
has no attribute 'hostname'`, raised out of the consumer as an unrecoverable error (cf.
celery/kombu#970, #582), and the worker exits. The same happens when a task that was running
across the restart finishes and acks through its old, closed channel (`... attribute 'client'`). Here that restore is best effort: messages it cannot
restore stay in kombu's `unacked` hash, where the janitor's liveness check
(polar_mq/tasks/recovery.py) hands them out again within a lease TTL.
"""

from __future__ import annotations

import logging

from kombu.transport import redis as kredis
from kombu.transport import virtual

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


class Channel(kredis.Channel):
    QoS = QoS


class Transport(kredis.Transport):
    Channel = Channel


TRANSPORT = f"{__name__}:Transport"
