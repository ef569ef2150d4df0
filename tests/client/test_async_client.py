"""``AsyncSkillClient`` against real workers: Redis, RabbitMQ with Redis results, and the
embedded default (SPEC section 12, issue 46)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from opentelemetry.sdk.trace import TracerProvider

from cleveragents import AsyncSkillClient
from cleveragents.aio.client import SEND_THREADS
from cleveragents.client import NoWorkerRunning
from cleveragents.constants import STATE_AWAITING_APPROVAL
from cleveragents.embedded.runner import LocalWorker
from cleveragents.settings import Settings
from cleveragents.skills import SkillErrorType
from tests.conftest import Broker
from tests.support.otlp import OtlpReceiver
from tests.support.procs import Worker, wait_until

pytestmark = pytest.mark.timeout(180)


def _client(broker: Broker) -> AsyncSkillClient:
    return AsyncSkillClient(settings=broker.settings())


def test_invoke_returns_each_kind_of_result_on_each_broker(
    broker: Broker, start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    start_worker(broker)
    count_file = tmp_path / "count"

    async def scenario() -> None:
        async with _client(broker) as client:
            assert client.results_by == "pubsub"
            ok = await client.invoke("test/basic", "test/echo", {"text": "hi"}, timeout=60)
            bad = await client.invoke("test/basic", "test/echo", {}, timeout=60)
            refused = await client.invoke(
                "test/basic", "test/count-write", {"path": str(count_file)}, timeout=60
            )
            wrote = await client.invoke(
                "test/basic",
                "test/count-write",
                {"path": str(count_file)},
                allow_writes=True,
                timeout=60,
            )
            assert ok.success
            assert ok.output_data == {"text": "hi"}
            assert bad.error is not None
            assert bad.error.error_type == SkillErrorType.VALIDATION_ERROR
            assert refused.error is not None
            assert refused.error.error_type == SkillErrorType.PERMISSION_DENIED
            assert wrote.success
            # A handle, and the stored result read back
            handle = await client.submit("test/basic", "test/echo", {"text": "again"})
            assert (await handle.result(timeout=60)).output_data == {"text": "again"}
            assert await handle.ready()
            stored = await client.get(handle.request_id)
            assert stored is not None
            assert stored.output_data == {"text": "again"}
            assert await client.get("never-sent") is None

    asyncio.run(scenario())
    assert count_file.read_text(encoding="utf-8") == "ran\n"  # only the allowed write ran


def test_two_hundred_awaited_calls_use_no_thread_each_and_leave_the_loop_responsive(
    broker: Broker, start_worker: Callable[..., Worker]
) -> None:
    start_worker(broker, concurrency=4)
    threads_before = threading.active_count()
    lags: list[float] = []
    threads_seen: list[int] = []

    async def ticker(stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            asked = loop.time()
            await asyncio.sleep(0.01)  # the ticker's own beat: its lateness is what is measured
            lags.append(loop.time() - asked - 0.01)
            threads_seen.append(threading.active_count())

    async def scenario() -> None:
        async with _client(broker) as client:
            stop = asyncio.Event()
            ticking = asyncio.create_task(ticker(stop))
            handles = [
                await client.submit("test/batch", "test/nap", {"ms": 20, "n": n})
                for n in range(200)
            ]
            results = await asyncio.gather(*(h.result(timeout=120) for h in handles))
            stop.set()
            await ticking
            assert [r.output_data for r in results] == [{"n": n} for n in range(200)]

    asyncio.run(scenario())
    # No thread per call: the client's send pool, and a thread or two of kombu's and Celery's
    assert max(threads_seen) <= threads_before + SEND_THREADS + 2, max(threads_seen)
    # And the loop kept ticking while 200 calls were awaited (a blocked loop lags seconds)
    lags.sort()
    assert len(lags) > 20
    assert lags[len(lags) // 2] < 0.02, lags[len(lags) // 2]
    assert lags[-1] < 0.25, lags[-1]


def test_cancelling_an_awaited_call_stops_the_wait_not_the_invocation(
    broker: Broker, start_worker: Callable[..., Worker]
) -> None:
    start_worker(broker)
    backend = redis.Redis.from_url(broker.backend)

    async def scenario() -> None:
        async with _client(broker) as client:
            handle = await client.submit("test/batch", "test/nap", {"ms": 1500, "n": 7})
            key = f"celery-task-meta-{handle.request_id}"
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(handle.result(), timeout=0.3)
            # The wait is gone (its channel unsubscribed), the invocation runs on
            wait_until(lambda: backend.pubsub_numsub(key)[0][1] == 0, 5, "unsubscribed")
            with pytest.raises(TimeoutError, match="not stopped"):
                await handle.result(timeout=0.2)
            result = await handle.result(timeout=60)
            assert result.output_data == {"n": 7}

    asyncio.run(scenario())
    backend.close()


def test_revoke_stops_an_invocation_before_it_starts(
    broker: Broker, start_worker: Callable[..., Worker]
) -> None:
    async def submit_and_revoke() -> str:
        async with _client(broker) as client:
            handle = await client.submit("test/basic", "test/echo", {"text": "never"})
            assert await handle.revoke()
            return handle.request_id

    request_id = asyncio.run(submit_and_revoke())
    start_worker(broker)  # only now does anything consume the queue

    async def result() -> Any:
        async with _client(broker) as client:
            return await client.wait(request_id, timeout=60)

    cancelled = asyncio.run(result())
    assert cancelled.error is not None
    assert cancelled.error.details["reason"] == "cancelled"


def test_a_request_id_bound_to_other_content_is_refused_without_running(
    broker: Broker, start_worker: Callable[..., Worker]
) -> None:
    start_worker(broker)

    async def scenario() -> None:
        async with _client(broker) as client:
            first = await client.invoke(
                "test/basic", "test/echo", {"text": "a"}, request_id="bound-1", timeout=60
            )
            same = await client.invoke(
                "test/basic", "test/echo", {"text": "a"}, request_id="bound-1", timeout=60
            )
            other = await client.invoke(
                "test/basic", "test/echo", {"text": "b"}, request_id="bound-1", timeout=60
            )
            assert first.success
            assert same == first
            assert other.error is not None
            assert other.error.details["reason"] == "request_id_reused"

    asyncio.run(scenario())


def test_a_call_awaiting_approval_says_so_and_runs_once_approved(
    broker: Broker, start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    start_worker(broker)
    log = tmp_path / "payments"

    async def scenario() -> None:
        async with _client(broker) as client:
            handle = await client.submit(
                "test/approvals",
                "test/send-payment",
                {"log": str(log), "key": "p1"},
                allow_writes=True,
            )
            for _ in range(300):
                if await handle.state() == STATE_AWAITING_APPROVAL:
                    break
                await asyncio.sleep(0.1)  # a bounded poll of the state (30 s), not a fixed wait
            assert await handle.state() == STATE_AWAITING_APPROVAL
            with pytest.raises(TimeoutError, match="awaiting approval"):
                await handle.result(timeout=0.5)
            await client.approve(handle.request_id, by="tester")
            assert (await handle.result(timeout=60)).success

    asyncio.run(scenario())
    assert "p1" in log.read_text(encoding="utf-8")


def test_the_current_span_becomes_the_parent_of_the_invocations_span(
    redis_url: str, start_worker: Callable[..., Worker]
) -> None:
    broker = Broker("redis", redis_url, redis_url)
    tracer = TracerProvider().get_tracer("agent")
    with OtlpReceiver() as receiver:
        start_worker(broker, **receiver.env())

        async def scenario() -> Any:
            async with _client(broker) as client:
                with tracer.start_as_current_span("agent turn") as agent:
                    result = await client.invoke(
                        "local/text-tools", "local/word-count", {"text": "a b"}, timeout=60
                    )
                assert result.success
                return agent.get_span_context()  # type: ignore[attr-defined]

        context = asyncio.run(scenario())
        wait_until(lambda: receiver.named("execute_tool"), 30, "an execute_tool span")
        [span] = receiver.named("execute_tool")
    assert span.trace_id == format(context.trace_id, "032x")
    assert span.parent_span_id == format(context.span_id, "016x")


def test_run_many_yields_the_results_in_input_order(
    broker: Broker, start_worker: Callable[..., Worker]
) -> None:
    start_worker(broker)
    requests = [
        {"skill": "test/batch", "tool": "test/nap", "arguments": {"ms": 1, "n": n}}
        for n in range(30)
    ]

    async def scenario() -> list[Any]:
        async with _client(broker) as client:
            return [r.output_data async for r in client.run_many(requests, chunk_size=7)]

    assert asyncio.run(scenario()) == [{"n": n} for n in range(30)]


def _embedded(tmp_path: Path) -> Settings:
    """The embedded default (its local worker runs the bundled examples)."""
    return Settings.from_env({"CLEVERAGENTS_HOME": str(tmp_path / "home")})


def test_on_the_embedded_default_results_are_awaited_through_its_servers_pubsub(
    tmp_path: Path,
) -> None:
    settings = _embedded(tmp_path)

    async def scenario() -> list[Any]:
        async with AsyncSkillClient(settings=settings) as client:
            assert client.results_by == "pubsub"  # the home's server is a Redis
            handles = [
                await client.submit("local/text-tools", "local/word-count", {"text": "a " * n})
                for n in range(20)
            ]
            results = await asyncio.gather(*(h.result(timeout=60) for h in handles))
            return [r.output_data if r.success else r.error for r in results]

    with LocalWorker(settings):
        assert asyncio.run(scenario()) == [{"words": n} for n in range(20)]


def test_on_the_embedded_default_a_wait_with_no_worker_says_so_within_seconds(
    tmp_path: Path,
) -> None:
    settings = _embedded(tmp_path)

    async def scenario() -> None:
        async with AsyncSkillClient(settings=settings) as client:
            handle = await client.submit("local/text-tools", "local/word-count", {"text": "x"})
            started = time.monotonic()
            with pytest.raises(NoWorkerRunning, match="cleveragents worker"):
                await handle.result(timeout=60)
            assert time.monotonic() - started < 10

    asyncio.run(scenario())
