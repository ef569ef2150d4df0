"""A submission on Redis: the message and its ``task-sent`` event in one round trip.

Flower shows an invocation waiting in a queue by its ``task-sent`` event; on Redis
the client sends it in the same pipeline as the message (``SkillClient._send_task``),
and a pipeline that failed is published again the usual way.
"""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kombu.exceptions import BatchPublishError  # type: ignore[attr-defined]  # kombu 5.7; not in its stubs
from kombu.transport.redis import PublishBatch  # type: ignore[attr-defined]

from cleveragents.client import SkillClient
from cleveragents.constants import QUEUE_READ
from tests.support.redis_sends import sends


@pytest.fixture
def producer(redis_url: str) -> Iterator[SkillClient]:
    with SkillClient(settings=_settings(redis_url)) as client:
        yield client


def _settings(url: str) -> Any:
    from cleveragents.settings import Settings

    return Settings.from_env({"CLEVERAGENTS_BROKER_URL": url})


def _events(pubsub: Any, wanted: int, timeout: float = 5.0) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while len(seen) < wanted and time.monotonic() < deadline:
        message = pubsub.get_message(timeout=0.1)
        if message and message["type"] == "pmessage":
            envelope = json.loads(message["data"])
            seen.append(json.loads(base64.b64decode(envelope["body"])))
    return seen


def _chunks(command: Any) -> list[bytes]:
    return list(command) if isinstance(command, list | tuple) else [command]


def _queued_ids(url: str) -> list[str]:
    server = redis.Redis.from_url(url)
    try:
        return [json.loads(raw)["headers"]["id"] for raw in server.lrange(QUEUE_READ, 0, -1)]
    finally:
        server.close()


def test_a_submission_is_one_round_trip_with_its_sent_event(
    redis_url: str, producer: SkillClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = redis.Redis.from_url(redis_url).pubsub()  # type: ignore[no-untyped-call]
    events.psubscribe("*celeryev*")
    producer.submit("local/common", "local/noop", {})  # connects and declares
    with sends(monkeypatch) as sent:
        handle = producer.submit("local/common", "local/noop", {})

    # Besides Celery's own subscription to the result's notification: one send holds
    # the message, its doorbell and its task-sent event
    commands = [re.findall(rb"\r\n([A-Z]{3,})\r\n", b"".join(_chunks(c))) for c in sent]
    publishing = [names for names in commands if names != [b"SUBSCRIBE"]]
    assert len(publishing) == 1, commands
    assert publishing[0].count(b"LPUSH") == 2  # the message and the doorbell
    assert b"PUBLISH" in publishing[0]
    assert _queued_ids(redis_url).count(handle.request_id) == 1
    kinds = [(e.get("type"), e.get("uuid")) for e in _events(events, 2)]
    assert ("task-sent", handle.request_id) in kinds
    events.close()


def test_a_failed_pipeline_is_published_again_the_usual_way(
    redis_url: str, producer: SkillClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    failed: list[bool] = []
    flush = PublishBatch.flush

    def failing(self: PublishBatch) -> None:
        if not failed:  # the first time only: nothing was sent, delivery uncertain
            failed.append(True)
            self.discard()
            raise BatchPublishError("Redis publish batch failed; delivery is uncertain")
        flush(self)

    monkeypatch.setattr(PublishBatch, "flush", failing)
    handle = producer.submit("local/common", "local/noop", {})
    assert failed
    assert _queued_ids(redis_url).count(handle.request_id) == 1


def test_publishing_makes_no_redis_client_per_message(
    producer: SkillClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # kombu made a redis.Redis per publish, whose reply-callback table redis-py builds
    # anew each time: as costly as the round trip itself
    producer.submit("local/common", "local/noop", {})
    made: list[int] = []
    init = redis.Redis.__init__

    def counted(self: redis.Redis, *args: Any, **kwargs: Any) -> None:
        made.append(1)
        init(self, *args, **kwargs)

    monkeypatch.setattr(redis.Redis, "__init__", counted)
    for _ in range(20):
        producer.submit("local/common", "local/noop", {})
    monkeypatch.undo()
    assert made == []


def test_a_queue_is_declared_once_per_connection_not_once_per_submission(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kombu.common

    declared: list[str] = []
    real = kombu.common._maybe_declare  # what kombu runs, through its retries, to declare

    def counting(entity: Any, channel: Any) -> Any:
        declared.append(getattr(entity, "name", ""))
        return real(entity, channel)

    monkeypatch.setattr(kombu.common, "_maybe_declare", counting)
    binding = f"_kombu.binding.{QUEUE_READ}"
    server = redis.Redis.from_url(redis_url)
    # The first submission on a connection declares its queue (kombu's binding in Redis;
    # the connection is kombu's pooled one, which earlier tests may have used: made anew)
    with SkillClient(settings=_settings(redis_url)) as client:
        with client.app.producer_or_acquire() as producer:
            producer.connection.close()
        client.submit("local/common", "local/noop", {})
        assert server.exists(binding)
        assert declared.count(QUEUE_READ) == 1
        # The next ones on the same connection do not ask kombu again
        for _ in range(5):
            client.submit("local/common", "local/noop", {})
        assert declared.count(QUEUE_READ) == 1
        # A connection made again (here, the pool's closed) declares again
        server.delete(binding)
        with client.app.producer_or_acquire() as producer:
            producer.connection.close()
        client.submit("local/common", "local/noop", {})
        assert server.exists(binding)
        assert declared.count(QUEUE_READ) == 2
    assert len(_queued_ids(redis_url)) == 7
    server.close()
