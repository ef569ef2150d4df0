"""RabbitMQ as broker: quorum skill queues with a dead-letter backstop, and their depths.

With ``CLEVERAGENTS_BROKER_URL=amqp://...`` the four skill queues are **quorum
queues**: replicated and durable, and each with a delivery limit
(``constants.DELIVERY_LIMIT``) past which RabbitMQ dead-letters a message into
``skills.dead`` instead of handing it out again. Whoever declares a skill queue (a
producer on its first publish, a worker when it starts consuming) declares
``skills.dead`` and its exchange first, so a dead letter always has a place to go.

Quorum queues have no message priorities (RabbitMQ 3.x) and none are used on Redis
either. Reading a queue's depth needs no management plugin: a passive
``queue.declare`` answers with the number of messages ready. How old the oldest of
them is cannot be read without taking it, so that is not reported here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

from kombu import Connection, Exchange, Queue

from cleveragents.broker.url_tls import amqps_tls
from cleveragents.constants import DELIVERY_LIMIT, QUEUE_DEAD
from cleveragents.settings import Settings

__all__ = [
    "AMQP_SCHEMES",
    "RabbitQueues",
    "SkillQueue",
    "dead_letter_queue",
    "heartbeat_s",
    "skill_queue",
    "transport_options",
    "uses_amqp",
]

#: URL schemes of kombu's AMQP transports (py-amqp).
AMQP_SCHEMES = ("amqp://", "amqps://", "pyamqp://")
#: Heartbeats RabbitMQ waits for at most, after a peer's last word, before it closes the
#: connection (it checks every heartbeat, and gives up after two checks with no traffic).
HEARTBEATS_TO_CLOSE = 3
#: Seconds to wait for RabbitMQ when reading queue depths.
CONNECT_TIMEOUT_S = 10.0

_QUORUM = {"x-queue-type": "quorum"}


def uses_amqp(settings: Settings) -> bool:
    """True when the broker is RabbitMQ (an AMQP URL)."""
    return (settings.broker_url or "").startswith(AMQP_SCHEMES)


def heartbeat_s(recovery_s: float) -> int:
    """The AMQP heartbeat, in whole seconds, for giving up on a silent worker within half
    of ``recovery_s``, as a Redis broker does (its heartbeat keys live ``recovery_s / 2``).

    RabbitMQ then hands back every message the worker held, prefetched ones included:
    a frozen worker (``SIGSTOP``, a hung machine) holds at most its prefetch (one
    message per process and queue) for at most that long. A killed process's
    connection closes at once, with no heartbeat to wait for.
    """
    return max(1, int(recovery_s / 2 // HEARTBEATS_TO_CLOSE))


def transport_options() -> dict[str, Any]:
    """kombu's py-amqp transport options for the skill worker."""
    return {
        # Publisher confirms: a publish returns once RabbitMQ has the message (a quorum
        # queue: once a majority of its replicas wrote it), so a producer that was told
        # "sent" has not lost it to a broker that died a moment later.
        "confirm_publish": True,
    }


def dead_letter_queue() -> Queue:
    """``skills.dead``: a quorum queue of messages past their delivery limit, never consumed."""
    return Queue(
        QUEUE_DEAD,
        Exchange(QUEUE_DEAD, type="direct"),
        routing_key=QUEUE_DEAD,
        queue_arguments=dict(_QUORUM),
    )


class SkillQueue(Queue):
    """A skill queue on RabbitMQ: declaring it declares ``skills.dead`` first."""

    def declare(self, nowait: bool = False, channel: Any = None) -> str | None:
        """Declare ``skills.dead``, then this queue, its exchange and binding."""
        if not getattr(self, "no_declare", False):
            dead_letter_queue().bind(channel or self.channel).declare(nowait=nowait)
        return super().declare(nowait=nowait, channel=channel)


def skill_queue(name: str) -> SkillQueue:
    """The quorum queue ``name`` behind a direct exchange of the same name."""
    arguments = {
        **_QUORUM,
        # The backstop to the guard's poison limit (constants.DELIVERY_LIMIT).
        "x-delivery-limit": DELIVERY_LIMIT,
        # Past it, into skills.dead rather than nowhere.
        "x-dead-letter-exchange": QUEUE_DEAD,
        "x-dead-letter-routing-key": QUEUE_DEAD,
    }
    return SkillQueue(
        name, Exchange(name, type="direct"), routing_key=name, queue_arguments=arguments
    )


class RabbitQueues:
    """The depths of RabbitMQ queues, read with a passive ``queue.declare`` each."""

    def __init__(self, url: str, names: Iterable[str]) -> None:
        self.url = url
        self.names = tuple(names)

    def lengths(self) -> dict[str, int]:
        """Messages ready in each queue (0 for a queue not declared yet).

        Raises:
            ConnectionError: RabbitMQ cannot be reached or refused us.
        """
        from amqp.exceptions import AMQPError, NotFound  # py-amqp, kombu's AMQP client
        from kombu.exceptions import KombuError  # a refused connection, after its retry

        try:
            url, tls = amqps_tls(self.url)
            with Connection(url, ssl=tls or False, connect_timeout=CONNECT_TIMEOUT_S) as connection:
                connection.ensure_connection(max_retries=1)
                depths: dict[str, int] = {}
                for name in self.names:
                    channel: Any = connection.channel()
                    try:
                        depths[name] = int(channel.queue_declare(queue=name, passive=True)[1])
                    except NotFound:  # nothing was ever sent to it: nothing waits
                        depths[name] = 0
                    finally:
                        with contextlib.suppress(Exception):  # NotFound closed it already
                            channel.close()
                return depths
        except (OSError, AMQPError, KombuError) as exc:
            raise ConnectionError(f"cannot read queue lengths from RabbitMQ: {exc}") from exc

    def oldest_ages(self, now: float) -> dict[str, float]:
        """Nothing: RabbitMQ tells the age of no waiting message without handing it out."""
        return {}
