"""A broker that goes away and comes back: one warning, and one line when it is back.

Celery's consumer logs a Redis restart it rides out as a warning, then an ERROR
for each attempt to connect again ("Cannot connect to ...: Trying again in 2.00
seconds... (1/None)"), a pending-deprecation warning with a paragraph of text, and
a line about prefetch counts: an operator cannot tell that from a real fault. Here
the first warning stays; the attempts are said again only once a minute while the
broker stays away (as warnings: the worker is riding it out); the paragraph and the
prefetch line go; and the line Celery logs on connecting says how long it took.

A connection RabbitMQ closed (a broker restart, a dropped connection) also makes
Celery log, with a traceback, its failure to close what was already closed: the
event loop's clean-up ("Error cleaning up after event loop: ConnectionResetError")
and a step's stop ("Error on stopping Hub: BrokenPipeError"). Those go too when
their error is the lost connection's; any other error there keeps its traceback.

The records are matched on Celery's own message constants (imported where Celery
names them, else its literal texts): a Celery that words them otherwise is let
through unchanged.
"""

from __future__ import annotations

import logging
import time
import warnings
from typing import Any

from amqp.exceptions import ConnectionError as AmqpConnectionError
from celery.exceptions import CPendingDeprecationWarning
from celery.worker.consumer import consumer as celery_consumer
from redis.exceptions import ConnectionError as RedisConnectionError

__all__ = ["STILL_AWAY_EVERY_S", "ReconnectLog", "install"]

#: While the broker stays away, the attempts to reach it are said this often.
STILL_AWAY_EVERY_S = 60.0
#: The loggers of Celery's consumer and of its connection step.
CONSUMER_LOGGER = "celery.worker.consumer.consumer"
CONNECTION_LOGGER = "celery.worker.consumer.connection"
#: Celery's texts of a lost connection and of an attempt to connect.
CONNECTION_RETRY: str = celery_consumer.CONNECTION_RETRY  # type: ignore[attr-defined]
CONNECTION_ERROR: str = celery_consumer.CONNECTION_ERROR  # type: ignore[attr-defined]
#: kombu's CRITICAL line, with a traceback, for an ack or reject the broker's loss cut off.
_COULD_NOT = ("Couldn't ack", "Couldn't reject")
#: The logger of a task request's ack (Celery's worker).
REQUEST_LOGGER = "celery.worker.request"
#: Celery's info line after a reconnection in per-consumer QoS mode (nothing to act on).
_PREFETCH_SKIPPED = "Skipping prefetch count reduction"
#: The loggers, and Celery's texts, of a clean-up that met the connection already closed.
BOOTSTEPS_LOGGER = "celery.bootsteps"
LOOPS_LOGGER = "celery.worker.loops"
_CLEAN_UP_FAILED = ("Error on %s %s: %r", "Error cleaning up after event loop: %r")
#: The errors of a connection that is gone.
_LOST = (OSError, AmqpConnectionError, RedisConnectionError)


class ReconnectLog(logging.Filter):
    """Filters and rewords the consumer's records of a lost broker connection."""

    def __init__(self) -> None:
        super().__init__()
        self.lost_at: float | None = None
        self.said_at = float("-inf")

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        msg = record.msg if isinstance(record.msg, str) else ""
        args = record.args if isinstance(record.args, tuple) else ()
        if msg.startswith(_PREFETCH_SKIPPED):
            return False
        if msg in _CLEAN_UP_FAILED and _lost_connection(record.exc_info):
            return False  # closing what the broker closed: the loss is said once already
        if msg.startswith(_COULD_NOT):  # an ack as the broker went: no traceback for it
            tag, exc = (*args, "", "")[:2]
            record.msg = (
                "could not acknowledge message %s (%r): the broker is away; it will be "
                "delivered again, and answered from its stored result if it finished"
            )
            record.args = (tag, exc)
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.exc_info, record.exc_text = None, None
            return True
        if args and args[0] == CONNECTION_RETRY:
            self.lost_at = now  # "Connection to broker lost": the one warning
            self.said_at = now
            return True
        if msg == CONNECTION_ERROR:
            if now - self.said_at < STILL_AWAY_EVERY_S:
                return False
            self.said_at = now
            if self.lost_at is None:  # never connected yet: Celery's line, once a minute
                return True
            uri, exc = (*args, "", "")[:2]
            record.msg = "consumer: still cannot reach %s after %.0f s (%s); retrying"
            record.args = (uri, now - self.lost_at, exc)
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            return True
        if msg.startswith("Connected to") and self.lost_at is not None:
            record.msg = f"{msg} again, after %.1f s away"
            record.args = (*args, now - self.lost_at)
            self.lost_at = None
            self.said_at = float("-inf")
        return True


def _lost_connection(exc_info: Any) -> bool:
    """Whether a record's exception is a connection's that is gone."""
    exc = exc_info[1] if isinstance(exc_info, tuple) and len(exc_info) == 3 else None
    return isinstance(exc, _LOST)


def install() -> ReconnectLog:
    """Put the filter on Celery's consumer loggers and silence the paragraph (a worker's
    main process, as logging is set up)."""
    warnings.filterwarnings(
        "ignore",
        message=r"\s*In Celery 5\.1 we introduced an optional breaking change",
        category=CPendingDeprecationWarning,
    )
    shared = ReconnectLog()
    loggers = (CONSUMER_LOGGER, CONNECTION_LOGGER, REQUEST_LOGGER, BOOTSTEPS_LOGGER, LOOPS_LOGGER)
    for name in loggers:
        logger = logging.getLogger(name)
        for old in [f for f in logger.filters if isinstance(f, ReconnectLog)]:
            logger.removeFilter(old)
        logger.addFilter(shared)
    return shared
