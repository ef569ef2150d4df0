"""A chunk yields its process only to an interactive invocation that waits.

(``cleveragents/broker/interactive_waiting.py``)

The check counts what waits in the interactive queues a worker consumes, on Redis
and the embedded broker, without taking it; batch chunks waiting do not count. On
RabbitMQ no count can tell (a worker takes interactive messages into its own
prefetch at once), so there a chunk always yields at the end of its slice.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cleveragents.broker.interactive_waiting import interactive_queues, interactive_waiting
from cleveragents.client import SkillClient
from cleveragents.constants import QUEUE_BATCH, QUEUE_READ, QUEUE_WRITE
from cleveragents.runtime.request import SkillInvocationRequest
from cleveragents.settings import Settings
from tests.conftest import Broker


@pytest.fixture(params=["redis", "embedded"])
def producer(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SkillClient]:
    """A producer (no worker anywhere) on each broker, its queues empty at first."""
    if request.param == "embedded":
        settings = Settings.from_env({"CLEVERAGENTS_HOME": str(tmp_path / "home")})
    else:
        broker: Broker = request.getfixturevalue("broker_" + request.param)
        settings = broker.settings()
    with SkillClient(settings=settings) as client:
        yield client


@pytest.fixture
def broker_redis(redis_url: str) -> Broker:
    return Broker("redis", redis_url, redis_url)


def _request(n: int) -> SkillInvocationRequest:
    return SkillInvocationRequest(
        skill="local/common", tool="local/noop", arguments={}, request_id=f"yield-{n}"
    )


def test_the_interactive_queues_are_those_consumed_but_the_batch_queues() -> None:
    with SkillClient(settings=Settings.from_env({"CLEVERAGENTS_BROKER_URL": "redis://x"})) as c:
        assert interactive_queues(c.app) == [QUEUE_READ, QUEUE_WRITE]
        c.app.amqp.queues.select([QUEUE_BATCH])  # a worker of batches alone (-Q)
        assert interactive_queues(c.app) == []
        assert interactive_waiting(c.app) is None  # its chunks never yield


def test_nothing_waits_until_an_interactive_invocation_is_queued(producer: SkillClient) -> None:
    waiting = interactive_waiting(producer.app)
    assert waiting is not None
    # Given empty queues: nothing waits
    assert waiting() is False
    # When only batch chunks are queued, still nothing a chunk should yield to
    producer.send_chunk([_request(1), _request(2)])
    assert waiting() is False
    # When an interactive invocation is queued (no worker takes it), it waits
    producer.send(_request(3))
    assert waiting() is True


def test_on_rabbitmq_a_chunk_always_yields(rabbit_url: str, redis_url: str) -> None:
    settings = Broker("rabbitmq", rabbit_url, redis_url).settings()
    with SkillClient(settings=settings) as client:
        assert interactive_queues(client.app) == [QUEUE_READ, QUEUE_WRITE]
        assert interactive_waiting(client.app) is None


def test_a_broker_that_cannot_be_asked_counts_as_waiting(tmp_path: Path) -> None:
    # A Redis that refuses connections: the chunk yields, as it always did
    settings = Settings.from_env({"CLEVERAGENTS_BROKER_URL": "redis://127.0.0.1:1/0"})
    with SkillClient(settings=settings) as client:
        client.app.conf.broker_connection_retry = False
        client.app.conf.broker_connection_max_retries = 0
        waiting = interactive_waiting(client.app)
        assert waiting is not None
        assert waiting() is True
