"""The batch path from Python: ``SkillClient.run_many`` against a real Redis and real workers."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from cleveragents.client import SkillClient
from cleveragents.constants import MAX_CHUNK_ITEMS
from cleveragents.skills import SkillErrorType, SkillResult
from tests.conftest import EVERY_BROKER, Broker, broker_for
from tests.support.procs import Worker, wait_until

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(params=EVERY_BROKER)
def broker(request: pytest.FixtureRequest, redis_url: str) -> Broker:
    """Redis, RabbitMQ, and the embedded default (issue 44: the fleet's queue tests)."""
    return broker_for(request, redis_url)

StartWorker = Callable[..., Worker]


def echo(text: str, **extra: Any) -> dict[str, Any]:
    return {"skill": "test/basic", "tool": "test/echo", "arguments": {"text": text}, **extra}


def stored_results(redis_url: str) -> int:
    """How many invocation results the result backend holds."""
    client = redis.Redis.from_url(redis_url)
    try:
        return len(client.keys("celery-task-meta-*"))
    finally:
        client.close()


def test_run_many_over_a_generator_yields_results_in_input_order(
    client: SkillClient, redis_url: str, start_worker: StartWorker
) -> None:
    start_worker(redis_url, concurrency=2)
    n = 2000
    consumed = 0

    def requests() -> Iterator[dict[str, Any]]:
        nonlocal consumed
        for i in range(n):
            consumed += 1
            yield echo(f"text-{i}")

    # Small chunks, so that the chunks finish out of order across the worker's processes.
    results = list(client.batches.run_many(requests(), chunk_size=50))

    assert consumed == n
    assert len(results) == n
    assert all(isinstance(r, SkillResult) for r in results)
    assert all(r.success for r in results), next(r.error for r in results if not r.success)
    assert [r.output_data["text"] for r in results] == [f"text-{i}" for i in range(n)]


def test_a_chunk_past_max_chunk_items_is_split_by_the_worker_and_loses_nothing(
    client: SkillClient, redis_url: str, start_worker: StartWorker
) -> None:
    # Given one chunk message of more requests than a chunk may run (the Python API
    # does not cap its size): the worker sends the items past MAX_CHUNK_ITEMS back
    # as messages of their own before it runs the rest
    start_worker(redis_url, concurrency=2)
    n = MAX_CHUNK_ITEMS + 700
    results = list(client.batches.run_many((echo(f"t-{i}") for i in range(n)), chunk_size=n))

    assert len(results) == n
    assert all(r.success for r in results), next(r.error for r in results if not r.success)
    assert [r.output_data["text"] for r in results] == [f"t-{i}" for i in range(n)]


def test_an_invalid_request_in_a_list_gets_a_validation_error_in_its_place(
    client: SkillClient, redis_url: str, start_worker: StartWorker
) -> None:
    start_worker(redis_url)
    requests: list[dict[str, Any]] = [
        echo("zero"),
        {"skill": "test/basic", "arguments": {"text": "no tool"}},  # missing field
        echo("two"),
        echo("three", allow_writes="yes"),  # wrong type: strict JSON types only
        {"skill": "test/basic", "tool": "test/echo", "arguments": {"text": 4}},  # bad arguments
        echo("five", request_id="has a space"),  # not a valid request id
        echo("six"),
    ]

    results = list(client.batches.run_many(requests))

    assert len(results) == len(requests)
    assert [r.success for r in results] == [True, False, True, False, False, False, True]
    assert [r.output_data["text"] for r in results if r.success] == ["zero", "two", "six"]
    for index in (1, 3, 4, 5):
        error = results[index].error
        assert error is not None
        assert error.error_type == SkillErrorType.VALIDATION_ERROR, (index, error)
    # An invalid request keeps the names it carried where they are strings.
    assert results[1].skill_name == "test/basic"
    assert results[3].tool_name == "test/echo"


def _round_trip(client: SkillClient, text: str) -> tuple[SkillResult, float]:
    started = time.monotonic()
    result = client.submit("test/basic", "test/echo", {"text": text}).result(timeout=30)
    return result, time.monotonic() - started


def test_an_interactive_invocation_is_served_while_a_large_batch_runs(
    broker: Broker, broker_client: SkillClient, start_worker: StartWorker
) -> None:
    # Both brokers keep a batch from starving interactive work, in different ways: Redis
    # fetches the read queue first (queue_order_strategy), RabbitMQ gives each queue of
    # a worker its own prefetch, so a read is handed over while batch chunks run.
    client, redis_url = broker_client, broker.backend
    start_worker(broker, concurrency=2)
    idle = min(_round_trip(client, f"idle-{i}")[1] for i in range(3))
    n = 1500
    batch_done = threading.Event()
    outcome: dict[str, Any] = {}

    def run_batch() -> None:
        try:
            requests = (
                {"skill": "test/batch", "tool": "test/nap", "arguments": {"ms": 2, "n": i}}
                for i in range(n)
            )
            outcome["results"] = list(client.batches.run_many(requests))
        except BaseException as exc:  # reported by the main thread
            outcome["error"] = exc
        finally:
            batch_done.set()

    thread = threading.Thread(target=run_batch, daemon=True)
    thread.start()
    try:
        # Given a batch well under way (both worker processes busy with its chunks)
        wait_until(lambda: stored_results(redis_url) >= 200, 60, "the batch to get going")
        assert not batch_done.is_set(), "the batch finished too soon to test anything"

        # When one interactive invocation is submitted
        result, latency = _round_trip(client, "interactive")
        during = stored_results(redis_url)
        still_running = not batch_done.is_set()
    finally:
        thread.join(120)

    # Then it came back fast, before the batch was over
    print(
        f"{broker.kind}: interactive round trip {latency * 1000:.0f} ms during a batch "
        f"({during}/{n} done), {idle * 1000:.0f} ms idle"
    )
    assert result.success, result.error
    assert result.output_data == {"text": "interactive"}
    assert still_running, f"the batch ended before the interactive result ({latency:.2f}s)"
    assert latency < 2.0, f"interactive invocation took {latency:.2f}s during a batch"
    # And the batch still completed, in order
    assert not thread.is_alive()
    assert "error" not in outcome, outcome.get("error")
    results = outcome["results"]
    assert [r.output_data["n"] for r in results] == list(range(n))
