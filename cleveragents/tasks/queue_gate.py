"""A write counts only on a message taken from a write queue.

Only producers and write workers may push onto ``skills.write`` and
``skills.batch.write`` (docs/deployment.md, "Redis users per role"); a read-only
worker's user may push onto the read queues, which write workers consume too. So a
request that allows writes but was taken from a read queue was sent by a role that
may not send a write: it runs without them (its write tool is refused by the write
gate, ``permission_denied``), and the worker says so once per message.

On Redis the queue is the one the fetch script took the message from
(``broker/redis/fetch.py``), not what the message says; on RabbitMQ the broker's
own routing key.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Task

from cleveragents.constants import QUEUE_BATCH, QUEUE_READ

__all__ = ["READ_QUEUES", "writes_as_queued"]

log = logging.getLogger("cleveragents.worker")

#: The queues a role that may not send a write may push onto.
READ_QUEUES = frozenset({QUEUE_READ, QUEUE_BATCH})


def writes_as_queued(task: Task[Any, Any], bodies: list[Any]) -> list[Any]:
    """``bodies`` as the message's queue allows: writes taken away on a read queue."""
    queue = (task.request.delivery_info or {}).get("routing_key")
    if queue not in READ_QUEUES:
        return bodies
    kept: list[Any] = []
    for body in bodies:
        if isinstance(body, dict) and body.get("allow_writes") is True:
            log.warning(
                "%s allows writes but came on the read queue %s: it runs without them (only "
                "producers and write workers may send a write, to skills.write)",
                body.get("request_id") or task.request.id,
                queue,
            )
            body = {**body, "allow_writes": False}
        kept.append(body)
    return kept
