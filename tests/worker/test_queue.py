"""The queue path end to end: a real Redis, real worker processes, the producer client.

The tests that take a ``broker`` run twice: on Redis, and on RabbitMQ (a virtual host
of their own) with the Redis as result backend.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import kombu
import pytest

from cleveragents.client import SkillClient
from cleveragents.constants import QUEUE_READ, QUEUE_WRITE, TASK_INVOKE
from cleveragents.skills import SkillErrorType
from tests.conftest import EVERY_BROKER, Broker, broker_for
from tests.support.procs import Worker
from tests.support.rabbit import queue_state

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(params=EVERY_BROKER)
def broker(request: pytest.FixtureRequest, redis_url: str) -> Broker:
    """Redis, RabbitMQ, and the embedded default (issue 44: the fleet's queue tests)."""
    return broker_for(request, redis_url)

StartWorker = Callable[..., Worker]


def test_a_successful_invocation_round_trips_through_a_worker(
    broker: Broker, broker_client: SkillClient, start_worker: StartWorker
) -> None:
    client = broker_client
    start_worker(broker)
    handle = client.submit("local/text-tools", "local/word-count", {"text": "one two three"})
    result = handle.result(timeout=30)
    assert result.success, result.error
    assert result.output_data == {"words": 3}
    assert result.skill_name == "local/text-tools"
    assert result.tool_name == "local/word-count"
    assert client.get(handle.request_id) == result
    assert client.state(handle.request_id) == "SUCCESS"


@pytest.mark.parametrize(
    ("skill", "tool", "arguments", "allow_writes", "expected"),
    [
        ("ops/bicycle", "ops/wheel", {}, False, SkillErrorType.SKILL_NOT_FOUND),
        ("test/basic", "local/word-count", {}, False, SkillErrorType.RESOLUTION_FAILURE),
        ("test/cycle-a", "test/echo", {}, False, SkillErrorType.CYCLE_DETECTED),
        ("test/basic", "test/missing-module", {}, False, SkillErrorType.TOOL_ACTIVATION_FAILURE),
        ("test/basic", "test/crash", {}, False, SkillErrorType.TOOL_EXECUTION_FAILURE),
        ("test/basic", "test/echo", {"text": 3}, False, SkillErrorType.VALIDATION_ERROR),
        (
            "test/basic",
            "test/count-write",
            {"path": "/nonexistent/x"},
            False,
            SkillErrorType.PERMISSION_DENIED,
        ),
    ],
)
def test_each_failure_kind_comes_back_as_a_skill_result(
    client: SkillClient,
    redis_url: str,
    start_worker: StartWorker,
    skill: str,
    tool: str,
    arguments: dict[str, object],
    allow_writes: bool,
    expected: SkillErrorType,
) -> None:
    start_worker(redis_url)
    handle = client.submit(skill, tool, arguments, allow_writes=allow_writes)
    result = handle.result(timeout=30)
    assert not result.success
    assert result.error is not None
    assert result.error.error_type == expected
    assert client.state(handle.request_id) == "FAILURE"


def test_a_read_only_worker_refuses_writes_even_when_the_request_allows_them(
    broker: Broker, broker_client: SkillClient, start_worker: StartWorker, tmp_path: Path
) -> None:
    # Given a read-only worker made to consume the write queue as well
    start_worker(broker, read_only=True, queues=f"{QUEUE_READ},{QUEUE_WRITE}")
    counter = tmp_path / "count"
    # When a write is submitted with allow_writes
    result = broker_client.submit(
        "test/basic", "test/count-write", {"path": str(counter)}, allow_writes=True
    ).result(timeout=30)
    # Then it is refused by the worker's gate and the tool never ran
    assert result.error is not None
    assert result.error.error_type == SkillErrorType.PERMISSION_DENIED
    assert result.error.details["gate"] == "worker_read_only"
    assert not counter.exists()


def test_a_read_only_worker_does_not_consume_the_write_queue(
    broker: Broker, broker_client: SkillClient, start_worker: StartWorker, tmp_path: Path
) -> None:
    client = broker_client
    start_worker(broker, read_only=True)
    write = client.submit(
        "test/basic", "test/count-write", {"path": str(tmp_path / "c")}, allow_writes=True
    )
    read = client.submit("test/basic", "test/echo", {"text": "hi"})
    assert read.result(timeout=30).success
    assert client.get(write.request_id) is None
    assert client.state(write.request_id) == "PENDING"
    if broker.kind == "rabbitmq":  # the write waits in its queue, which nobody consumes
        assert queue_state(broker.url, QUEUE_WRITE) == (1, 0)
        assert queue_state(broker.url, QUEUE_READ)[1] == 1


def test_the_request_flag_is_honoured_through_the_queue(
    client: SkillClient, redis_url: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    start_worker(redis_url)
    counter = tmp_path / "count"
    refused = client.submit("test/basic", "test/count-write", {"path": str(counter)})
    assert refused.result(timeout=30).error is not None
    assert not counter.exists()
    allowed = client.submit(
        "test/basic", "test/count-write", {"path": str(counter)}, allow_writes=True
    ).result(timeout=30)
    assert allowed.success, allowed.error
    assert counter.read_text() == "ran\n"
    assert allowed.resource_changes == [{"action": "changed", "resource": str(counter)}]


def _publish_raw(
    redis_url: str,
    body: object,
    task_id: str,
    *,
    content_type: str = "application/json",
    serializer: str | None = "json",
) -> None:
    # A producer that does not use our client: raw Celery protocol-2 messages.
    headers = {
        "lang": "py",
        "task": TASK_INVOKE,
        "id": task_id,
        "root_id": task_id,
        "parent_id": None,
        "group": None,
        "argsrepr": "",
        "kwargsrepr": "",
    }
    with kombu.Connection(redis_url) as conn:
        producer = conn.Producer()
        exchange = kombu.Exchange(QUEUE_READ, type="direct")
        if serializer is None:
            producer.publish(
                body,
                exchange=exchange,
                routing_key=QUEUE_READ,
                headers=headers,
                content_type=content_type,
                content_encoding="utf-8",
                declare=[kombu.Queue(QUEUE_READ, exchange, routing_key=QUEUE_READ)],
            )
        else:
            producer.publish(
                body,
                exchange=exchange,
                routing_key=QUEUE_READ,
                headers=headers,
                serializer=serializer,
                declare=[kombu.Queue(QUEUE_READ, exchange, routing_key=QUEUE_READ)],
            )


@pytest.mark.parametrize(
    "body",
    [
        [[{"skill": "test/basic"}], {}, {}],  # missing the tool
        [[{"skill": 7, "tool": ["x"], "arguments": "no"}], {}, {}],  # wrong types
        [["not", "an", "object"], {}, {}],  # positional junk
        [[], {"unexpected": True}, {}],  # keyword junk
    ],
)
def test_a_malformed_request_becomes_a_validation_error_and_the_worker_keeps_serving(
    client: SkillClient, redis_url: str, start_worker: StartWorker, body: object
) -> None:
    worker = start_worker(redis_url)
    _publish_raw(redis_url, body, "malformed-1")
    bad = client.wait("malformed-1", timeout=30)
    assert bad.error is not None
    assert bad.error.error_type == SkillErrorType.VALIDATION_ERROR
    good = client.submit("test/basic", "test/echo", {"text": "still here"}).result(timeout=30)
    assert good.success
    assert worker.alive()


def test_a_body_that_is_not_json_does_not_stop_the_worker(
    client: SkillClient, redis_url: str, start_worker: StartWorker
) -> None:
    worker = start_worker(redis_url)
    _publish_raw(redis_url, b"{not json", "garbage-1", serializer=None)
    good = client.submit("test/basic", "test/echo", {"text": "next"}).result(timeout=30)
    assert good.success
    assert worker.alive()


def test_a_timed_out_tool_is_reported_and_the_worker_process_stays_usable(
    client: SkillClient, redis_url: str, start_worker: StartWorker
) -> None:
    worker = start_worker(redis_url, concurrency=1)
    children = worker.child_pids()
    result = client.submit("test/basic", "test/hang", {"seconds": 30}, timeout_s=0.5).result(
        timeout=30
    )
    assert result.error is not None
    assert result.error.error_type == SkillErrorType.TOOL_EXECUTION_FAILURE
    assert result.error.details["reason"] == "timeout"
    assert result.duration_ms < 5000
    assert client.submit("test/basic", "test/echo", {"text": "ok"}).result(timeout=30).success
    assert worker.child_pids() == children  # the same pool process served both


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b"{not json", "application/json"),
        (b"\x80\x04\x95\x05\x00\x00\x00\x00\x00\x00\x00]\x94.", "application/x-python-serialize"),
        (b"<xml/>", "application/xml"),
    ],
)
def test_a_message_that_cannot_be_decoded_gets_a_validation_error_result(
    client: SkillClient,
    redis_url: str,
    start_worker: StartWorker,
    body: bytes,
    content_type: str,
) -> None:
    worker = start_worker(redis_url)
    _publish_raw(redis_url, body, "undecodable-1", content_type=content_type, serializer=None)
    bad = client.wait("undecodable-1", timeout=30)
    assert bad.error is not None
    assert bad.error.error_type == SkillErrorType.VALIDATION_ERROR
    assert client.submit("test/basic", "test/echo", {"text": "next"}).result(timeout=30).success
    assert worker.alive()
    assert "not json" not in worker.log_text()  # the body is never logged
