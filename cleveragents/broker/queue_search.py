"""Whether an invocation waits in (or is held from) a broker queue, found by its request id.

``cleveragents result`` of an id with no result asks this to tell an id still
waiting from one that was never sent. The CLI, batches and a request id chosen
by the caller bind the id before sending (``cleveragents.pipeline.binding``), but a
``SkillClient`` submission with a fresh id is known only to the broker until a
worker takes it. So the waiting messages are read, never taken: Redis lists and
kombu's ``unacked`` hashes (the embedded default's server is a Redis too).
RabbitMQ cannot be read without taking messages: there the answer is "cannot tell".
"""

from __future__ import annotations

from collections.abc import Iterator

from kombu.transport import redis as kombu_redis

from cleveragents.broker.celery_settings import redis_url
from cleveragents.broker.internals import fits
from cleveragents.broker.redis.liveness import RecoveryKeys
from cleveragents.constants import QUEUE_BATCH, QUEUE_BATCH_WRITE, QUEUE_READ, QUEUE_WRITE
from cleveragents.settings import Settings

__all__ = ["SEARCHED_AT_MOST", "is_waiting"]

#: Messages read at most per queue: an id deeper in a backed-up queue is not found.
SEARCHED_AT_MOST = 200_000
#: kombu's Redis transport keeps fetched, unacknowledged messages in this hash (its
#: ``Channel.unacked_key``, read from kombu rather than written here again), and
#: read-only workers in their role's own (``RecoveryKeys``).
_UNACKED: tuple[str, ...] = (kombu_redis.Channel.unacked_key, RecoveryKeys.of(True).unacked)
_PAGE = 1_000


def is_waiting(settings: Settings, request_id: str) -> bool | None:
    """True if a message for ``request_id`` waits or is held; None where no one can tell.

    A single invocation's message names its id in the clear; so does a batch
    chunk's in its body, which the Redis and file transports store base64-encoded,
    but batch ids are bound before they are sent, so they never need this search.
    """
    needle = request_id.encode()
    url = redis_url(settings)
    if url is not None and fits("queue-search"):  # kombu's unacked hash, as 5.7 keeps it
        return any(needle in raw for raw in _redis_messages(url))
    return None


def _redis_messages(url: str) -> Iterator[bytes]:
    import redis  # the client only when asked

    client = redis.Redis.from_url(url)
    try:
        for queue in (QUEUE_READ, QUEUE_WRITE, QUEUE_BATCH, QUEUE_BATCH_WRITE):
            for start in range(0, SEARCHED_AT_MOST, _PAGE):
                page = client.lrange(queue, start, start + _PAGE - 1)
                yield from map(_raw, page)
                if len(page) < _PAGE:
                    break
        for held in _UNACKED:
            for _, raw in client.hscan_iter(held, count=_PAGE):
                yield _raw(raw)
    finally:
        client.close()


def _raw(value: bytes | str) -> bytes:
    return value if isinstance(value, bytes) else value.encode()
