"""A retried invocation, or one that waited for a limit, stays in the caller's trace.

Issue 48, item 1: the message a worker sends back (a retry, or a wait for a tool's
limits) carried no trace context, so attempts 2 and 3 and every waited call began a
trace of their own. Each attempt is its own ``execute_tool`` span, in the trace the
call was sent in, under the caller's span, told apart by ``cleveragents.attempt``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider

from cleveragents.client import SkillClient
from tests.conftest import Broker
from tests.support.otlp import OtlpReceiver
from tests.support.procs import Worker, wait_until

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as found:
        yield found


def test_every_attempt_of_a_retried_call_is_a_span_in_the_callers_trace(
    broker: Broker,
    broker_client: SkillClient,
    start_worker: Callable[..., Worker],
    receiver: OtlpReceiver,
    tmp_path: Path,
) -> None:
    # (its command tool runs as root here, to write into root's tmp_path)
    start_worker(broker, CLEVERAGENTS_TOOL_USER="root", **receiver.env())
    tracer = TracerProvider().get_tracer("agent")
    marker = tmp_path / f"marker-{uuid.uuid4().hex}"
    # Given a command tool that fails transiently once (exit 75), then succeeds
    with tracer.start_as_current_span("agent turn") as agent:
        handle = broker_client.submit("test/retries", "test/tempfail", {"marker": str(marker)})
    assert handle.result(timeout=60).success
    wait_until(lambda: len(receiver.named("execute_tool")) >= 2, 30, "two attempts' spans")
    spans = receiver.named("execute_tool")
    mine = [s for s in spans if s.attributes.get("gen_ai.tool.call.id") == handle.request_id]
    context = agent.get_span_context()
    # Then both attempts are spans of the agent's trace, children of its span
    assert sorted(s.attributes["cleveragents.attempt"] for s in mine) == [1, 2]
    assert {s.trace_id for s in mine} == {f"{context.trace_id:032x}"}
    assert {s.parent_span_id for s in mine} == {f"{context.span_id:016x}"}
    # And the stored result names that trace
    assert broker_client.trace_id(handle.request_id) == f"{context.trace_id:032x}"


def test_a_call_that_waited_for_a_limit_stays_in_its_own_trace(
    broker: Broker,
    broker_client: SkillClient,
    start_worker: Callable[..., Worker],
    receiver: OtlpReceiver,
    tmp_path: Path,
) -> None:
    start_worker(broker, concurrency=3, **receiver.env())
    tracer = TracerProvider().get_tracer("agent")
    # Given three calls of a one-at-a-time tool, each sent in a trace of its own
    calls = []
    for n in range(3):
        with tracer.start_as_current_span(f"agent turn {n}") as turn:
            args = {"log": str(tmp_path / "log"), "key": f"k{n}", "seconds": 0.5}
            handle = broker_client.submit("test/limits", "test/one-at-a-time", args)
            calls.append((handle, f"{turn.get_span_context().trace_id:032x}"))
    for handle, _ in calls:
        assert handle.result(timeout=60).success
    wait_until(lambda: len(receiver.named("execute_tool")) >= 3, 30, "three spans")
    # Then each call's span is in the trace it was sent in (two of them waited)
    for handle, trace_id in calls:
        spans = [
            s
            for s in receiver.named("execute_tool")
            if s.attributes.get("gen_ai.tool.call.id") == handle.request_id
        ]
        assert spans, handle.request_id
        assert {s.trace_id for s in spans} == {trace_id}, handle.request_id
        assert broker_client.trace_id(handle.request_id) == trace_id
