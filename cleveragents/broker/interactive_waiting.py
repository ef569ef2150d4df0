"""Whether an interactive invocation waits in this worker's queues (a chunk yields to it).

A chunk of quick tools that ends its slice only goes back to its queue when
something else waits for the process (``cleveragents.pipeline.execute_chunk``,
``others_waiting``). What waits is counted where it waits, without taking it: on
Redis (the embedded default's server too) one pipeline of ``LLEN`` over the
interactive queues this worker consumes. There a worker whose processes are all
busy holds no message it does not run (its prefetch is its concurrency), so an
interactive invocation that waits for this process is in its queue.

Not on RabbitMQ: there each queue a worker consumes has its own prefetch, so an
interactive message waits inside the worker, where no count of the queue sees
it; a chunk there always goes back at the end of its slice. Any error answers
"something waits": the chunk then goes back, as it always did.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

from cleveragents.broker.rabbitmq import AMQP_SCHEMES
from cleveragents.constants import QUEUE_BATCH, QUEUE_BATCH_WRITE

__all__ = ["interactive_queues", "interactive_waiting"]

log = logging.getLogger("cleveragents.worker")

_BATCH_QUEUES = frozenset({QUEUE_BATCH, QUEUE_BATCH_WRITE})


def interactive_queues(app: Any) -> list[str]:
    """The queues this worker consumes that are not batch queues, in its order."""
    consumed = app.amqp.queues.consume_from or app.amqp.queues
    return [name for name in consumed if name not in _BATCH_QUEUES]


def _count(connection: Any, queues: list[str]) -> int:
    channel = connection.default_channel
    steps = getattr(channel, "priority_steps", None)
    if steps is not None and hasattr(channel, "_q_for_pri"):  # kombu's Redis channel
        with channel.conn_or_acquire() as client:
            pipe = client.pipeline(transaction=False)
            for queue in queues:
                for priority in steps:
                    pipe.llen(channel._q_for_pri(queue, priority))
            return sum(int(size) for size in pipe.execute())
    # kombu's other virtual transports: the messages queued.
    return sum(_ready(connection, queue) for queue in queues)


def _ready(connection: Any, queue: str) -> int:
    # A channel of its own, in case the transport closes the channel of a passive
    # declaration of a queue not declared yet (nothing was ever sent to it).
    channel = connection.channel()
    try:
        return int(channel.queue_declare(queue=queue, passive=True)[1])
    except Exception as exc:
        if getattr(exc, "code", None) == 404 or "NOT_FOUND" in str(exc):
            return 0
        raise
    finally:
        with contextlib.suppress(Exception):  # closed already, after a NOT_FOUND
            channel.close()


def interactive_waiting(app: Any) -> Callable[[], bool] | None:
    """A check of whether an interactive invocation waits; None when no check can tell
    (RabbitMQ), or the worker consumes no interactive queue."""
    queues = interactive_queues(app)
    if not queues or str(app.conf.broker_url or "").startswith(AMQP_SCHEMES):
        return None

    def waiting() -> bool:
        try:
            with app.pool.acquire(block=True) as connection:
                return _count(connection, queues) > 0
        except Exception as exc:
            log.debug("could not count waiting invocations (%s): the chunk yields", exc)
            return True

    return waiting
