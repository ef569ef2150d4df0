"""The worker's event heartbeat, whose sends can never hold the event loop for long.

Celery's ``Heart._send`` sends ``worker-heartbeat`` every 2 s with ``retry=True`` and no
retry policy (celery/celery#4804), which kombu's ``Connection.ensure`` reads as
"reconnect for ever". The send runs on the worker's event loop, so when the
event connection cannot be made again (RabbitMQ dropped it, and each new
connection stalls in its handshake) the worker stands still: no message taken,
no acknowledgement, no log line, while the broker hands its messages to others.
A 30-minute soak on RabbitMQ met that once (docs/operations.md).

Two ways were seen (tests/worker/test_heartbeat.py): a broker that accepts
connections and never completes a handshake, and a producer left on a channel of
a connection already replaced, whose declaration kombu retries on that dead
channel after each new connection (52,142 connections in one worker of the soak).

Here the heartbeat retries a bounded number of times; past them its event waits
in the dispatcher's buffer (Celery's own offline buffer, sent when the consumer
reconnects), the dispatcher's producer is turned to a fresh channel, and the
event loop goes on: a broken consumer connection is found there, and Celery's
reconnection, which says what it does in the log, takes over.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.worker import heartbeat
from celery.worker.consumer import heart

__all__ = [
    "BOUNDED_HEART",
    "HEARTBEAT_RETRY_POLICY",
    "HEART_STEP",
    "BoundedHeart",
    "BoundedRetries",
]

log = logging.getLogger("cleveragents.worker")

#: Celery's heartbeat step, by the name its consumer blueprint lists (Celery 5.7).
HEART_STEP = "celery.worker.consumer.heart:Heart"
#: The step that replaces it.
BOUNDED_HEART = "cleveragents.worker.heartbeat:BoundedHeart"

#: One reconnection attempt after a failed send, at once: a heartbeat is at most two
#: connection attempts (each ``broker_connection_timeout``, 4 s) late, then buffered.
HEARTBEAT_RETRY_POLICY: dict[str, float] = {
    "max_retries": 1,
    "interval_start": 0,
    "interval_step": 1,
    "interval_max": 1,
}


class BoundedRetries:
    """An event dispatcher whose retried sends stop after ``HEARTBEAT_RETRY_POLICY``.

    A send that still fails leaves its event in the dispatcher's offline buffer, and
    the dispatcher's producer is turned to the connection's current channel: kombu
    retries a declaration on the channel it was first given, so a producer left on
    the channel of a connection already replaced fails every send after it (and,
    retried for ever, opened a new connection to RabbitMQ hundreds of times a second
    in the soak).
    """

    def __init__(self, dispatcher: Any) -> None:
        self._dispatcher = dispatcher

    def send(self, type: str, *args: Any, retry: bool = False, **fields: Any) -> Any:
        """The dispatcher's ``send``, with a bounded retry policy when it retries."""
        if not retry:
            return self._dispatcher.send(type, *args, **fields)
        if fields.get("retry_policy") is None:
            fields["retry_policy"] = dict(HEARTBEAT_RETRY_POLICY)
        buffered = len(self._dispatcher._outbound_buffer)
        sent = self._dispatcher.send(type, *args, retry=True, **fields)
        if len(self._dispatcher._outbound_buffer) > buffered:  # it failed: buffered
            self._renew_channel()
        return sent

    def _renew_channel(self) -> None:
        producer = getattr(self._dispatcher, "producer", None)
        connection = getattr(self._dispatcher, "connection", None)
        if producer is not None and connection is not None:
            log.debug("an event could not be sent; the next one goes through a new channel")
            producer.revive(connection)  # lazily: its next publish opens the channel

    def __getattr__(self, name: str) -> Any:
        return getattr(self._dispatcher, name)


class BoundedHeart(heart.Heart):  # type: ignore[misc]
    """Celery's heartbeat step, sending through ``BoundedRetries``."""

    heartbeat_interval: float | None  # Celery's, set in __init__

    def start(self, c: Any) -> None:
        """Start Celery's ``Heart`` on the bounded dispatcher."""
        c.heart = heartbeat.Heart(
            c.timer, BoundedRetries(c.event_dispatcher), self.heartbeat_interval
        )
        c.heart.start()
