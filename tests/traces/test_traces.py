"""One trace from the agent into the tool: each invocation an ``execute_tool`` span, received
by a local OTLP/HTTP receiver that decodes the real protobuf payloads."""

from __future__ import annotations

import contextvars
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client, types
from opentelemetry.sdk.trace import TracerProvider

from cleveragents.client import SkillClient
from cleveragents.mcp.naming import ToolTable
from cleveragents.settings import Settings
from cleveragents.skills import Catalogue, SkillResult
from cleveragents.traces import otel
from tests.conftest import Broker
from tests.runtime.test_mcp_kind import ROOT_TOOL_USER
from tests.support.mcp_remote import MCP_KIND_SKILLS
from tests.support.mcp_support import CLEVERAGENTS, serve_env
from tests.support.otlp import OtlpReceiver, ReceivedSpan
from tests.support.procs import EXAMPLE_SKILLS, REPO, Worker, wait_until

pytestmark = pytest.mark.timeout(180)

SECRET = "arg-value-9931"


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as found:
        yield found


def _spans(receiver: OtlpReceiver, count: int, prefix: str = "execute_tool") -> list[ReceivedSpan]:
    wait_until(lambda: len(receiver.named(prefix)) >= count, 30, f"{count} {prefix} spans")
    return receiver.named(prefix)


def word_count_tool() -> str:
    """The MCP name of `local/word-count`, as `mcp serve` lists it."""
    table = ToolTable.from_catalogue(Catalogue.from_paths(EXAMPLE_SKILLS))
    (name,) = [
        r.name
        for r in table.routes.values()
        if (r.skill, r.tool) == ("local/text-tools", "local/word-count")
    ]
    return name


def _clean_env() -> dict[str, str]:
    return {
        k: v for k, v in os.environ.items() if not k.startswith(("CLEVERAGENTS_", "OTEL_", "TRACE"))
    }


def test_a_producers_span_is_the_parent_of_each_invocations_span(
    broker: Broker,
    broker_client: SkillClient,
    start_worker: Callable[..., Worker],
    receiver: OtlpReceiver,
) -> None:
    start_worker(broker, **receiver.env())
    tracer = TracerProvider().get_tracer("agent")
    # Given an agent's span, inside which it submits a read and a write that is refused
    with tracer.start_as_current_span("agent turn") as agent:
        read = broker_client.submit("local/text-tools", "local/word-count", {"text": SECRET})
        write = broker_client.submit(
            "test/approvals", "test/record", {"log": "/nonexistent/x", "key": SECRET}
        )
    assert read.result(timeout=60).success
    refused = write.result(timeout=60)
    assert refused.error is not None
    context = agent.get_span_context()
    spans = {s.attributes["gen_ai.tool.call.id"]: s for s in _spans(receiver, 2)}
    ok, failed = spans[read.request_id], spans[write.request_id]
    # Then each is a span of the agent's trace, a child of the agent's span
    for span in (ok, failed):
        assert span.trace_id == format(context.trace_id, "032x")
        assert span.parent_span_id == format(context.span_id, "016x")
        assert span.attributes["gen_ai.operation.name"] == "execute_tool"
        assert span.service == "cleveragents-worker"
        assert isinstance(span.attributes["cleveragents.queue_wait_ms"], float)
        assert span.attributes["cleveragents.attempt"] == 1
    assert ok.name == "execute_tool local/word-count"
    assert ok.attributes["gen_ai.tool.name"] == "local/word-count"
    assert ok.attributes["cleveragents.skill"] == "local/text-tools"
    assert ok.status_code == 0
    # And the failure says what refused it
    assert failed.status_code == 2
    assert failed.attributes["error.type"] == "permission_denied"
    assert failed.attributes["cleveragents.gate"] == refused.error.details["gate"]
    # And no argument value travels
    assert SECRET not in repr(receiver.spans)
    # And the stored result names the trace
    assert broker_client.trace_id(read.request_id) == ok.trace_id


def test_the_cli_joins_the_trace_its_environment_names(
    redis_url: str, start_worker: Callable[..., Worker], receiver: OtlpReceiver
) -> None:
    start_worker(redis_url, **receiver.env())
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    env = {
        **_clean_env(),
        "CLEVERAGENTS_BROKER_URL": redis_url,
        "PYTHONPATH": str(REPO),
        "TRACEPARENT": parent,
    }
    done = subprocess.run(
        [sys.executable, "-m", "cleveragents", "submit", "local/text-tools", "local/word-count",
         "--args", '{"text": "a b"}', "--wait", "--json"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    [span] = _spans(receiver, 1)
    assert span.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert span.parent_span_id == "00f067aa0ba902b7"
    # `result --json` (and `submit --wait --json`) name the trace
    assert printed["trace_id"] == span.trace_id
    # A TRACEPARENT that is not one is said, not silently dropped
    env["TRACEPARENT"] = "4bf92f3577b34da6a3ce929d0e0e4736"
    bad = subprocess.run(
        [sys.executable, "-m", "cleveragents", "result", printed["request_id"], "--json"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert bad.returncode == 0, bad.stderr
    assert "warning: TRACEPARENT is not a W3C traceparent" in bad.stderr


def test_console_spans_of_the_embedded_default_land_in_the_local_workers_log(
    tmp_path: Path,
) -> None:
    # Given the embedded default with OTEL_TRACES_EXPORTER=console (issue 48, item 7)
    env = {**_clean_env(), "CLEVERAGENTS_HOME": str(tmp_path / "home"),
           "PYTHONPATH": str(REPO), "OTEL_TRACES_EXPORTER": "console"}  # fmt: skip
    # When `submit --wait` runs one invocation on the local worker it starts and stops
    done = subprocess.run(
        [sys.executable, "-m", "cleveragents", "submit", "local/text-tools", "local/word-count",
         "--args", '{"text": "a b"}', "--wait", "--json"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # Then its span is in the local worker's log, in the trace the result names
    log = (tmp_path / "home" / "logs" / "local-worker.log").read_text(encoding="utf-8")
    assert '"name": "execute_tool local/word-count"' in log
    assert f'"trace_id": "0x{json.loads(done.stdout)["trace_id"]}"' in log


#: Runs an invocation in-process (Celery's eager apply), then prints whether it succeeded
#: and which tracing modules were imported; ``BLOCK`` makes OpenTelemetry unimportable,
#: as without the extra.
_PROBE = """
import json, sys
if sys.argv[1] == "block":
    class Block:
        def find_spec(self, name, path=None, target=None):
            if name == "opentelemetry" or name.startswith("opentelemetry."):
                raise ImportError(name + " is not installed")
    sys.meta_path.insert(0, Block())
from cleveragents.client import SkillClient
import cleveragents.tasks
from cleveragents.tasks.invoke import invoke
body = {"skill": "local/text-tools", "tool": "local/word-count", "arguments": {"text": "a b"}}
out = invoke.apply(args=[body], task_id="no-trace-1").get()
with SkillClient() as client:
    client.send(client.build_request("local/text-tools", "local/word-count", {"text": "c"}))
watched = ("cleveragents.traces.otel", "opentelemetry.propagate", "opentelemetry.sdk.trace")
print(json.dumps([out["success"], [m for m in watched if m in sys.modules]]))
"""


def test_an_invocations_span_is_exported_in_its_callers_trace_without_a_worker(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given this process exporting to the receiver, as a worker's pool process would
    for name, value in receiver.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(otel, "_provider", None)
    monkeypatch.setattr(otel, "_tracer_of_pid", None)
    monkeypatch.setattr(otel, "_pid", 0)
    with TracerProvider().get_tracer("agent").start_as_current_span("agent turn") as agent:
        headers = otel.carrier()
    # When an invocation runs in the trace its headers carry
    done = SkillResult(skill_name="local/text-tools", tool_name="local/word-count", success=True)
    with (
        otel.attached(headers),
        otel.tool_span("local/text-tools", "local/word-count", "r-1") as record,
    ):
        record(done, None)
    otel.flush()
    try:
        [span] = _spans(receiver, 1)
    finally:
        assert otel._provider is not None
        otel._provider.shutdown()
    # Then its span is the agent's span's child, and names the invocation
    assert span.trace_id == format(agent.get_span_context().trace_id, "032x")
    assert span.parent_span_id == format(agent.get_span_context().span_id, "016x")
    assert span.attributes["gen_ai.tool.call.id"] == "r-1"
    assert span.attributes["cleveragents.skill"] == "local/text-tools"


@pytest.mark.parametrize("extra", ["installed", "block"])
def test_without_tracing_nothing_of_it_is_imported_or_paid(redis_url: str, extra: str) -> None:
    env = {**_clean_env(), "CLEVERAGENTS_BROKER_URL": redis_url, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, extra], env=env, cwd=REPO, capture_output=True,
        text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    success, imported = json.loads(done.stdout.strip().splitlines()[-1])
    assert success is True
    assert imported == []


def test_an_mcp_call_joins_the_trace_its_meta_names(
    redis_url: str, start_worker: Callable[..., Worker], receiver: OtlpReceiver
) -> None:
    start_worker(redis_url, **receiver.env())
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

    async def call() -> types.CallToolResult:
        params = StdioServerParameters(
            command=CLEVERAGENTS, args=["mcp", "serve"], env=serve_env(redis_url), cwd=REPO
        )
        async with (
            stdio_client(params) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            meta: Any = {"traceparent": parent}  # a RequestParamsMeta (a TypedDict) with extra keys
            answer: types.CallToolResult = await session.call_tool(
                word_count_tool(), {"text": "a b c"}, meta=meta
            )
            return answer

    result = anyio.run(call)
    assert not result.is_error, result
    [span] = _spans(receiver, 1)
    assert span.trace_id == "0af7651916cd43dd8448eb211c80319c"
    assert span.parent_span_id == "b7ad6b7169203331"


def test_a_source_mcp_tool_passes_the_trace_on_to_its_server(
    redis_url: str, start_worker: Callable[..., Worker], receiver: OtlpReceiver
) -> None:
    start_worker(
        redis_url,
        CLEVERAGENTS_CATALOGUE=str(MCP_KIND_SKILLS),
        **ROOT_TOOL_USER,
        **receiver.env(),
    )
    tracer = TracerProvider().get_tracer("agent")
    with SkillClient(settings=Settings.from_env({"CLEVERAGENTS_BROKER_URL": redis_url})) as client:
        with tracer.start_as_current_span("agent turn") as agent:
            handle = client.submit("remote/fixture", "remote/whoami")
        result = handle.result(timeout=90)
    assert result.success, result.error
    [span] = _spans(receiver, 1)
    sent = str(result.output_data["traceparent"])
    # The server got the invocation's span as its parent, in the agent's trace
    assert sent.rsplit("-", 1)[0] == f"00-{span.trace_id}-{span.span_id}"
    assert span.trace_id == format(agent.get_span_context().trace_id, "032x")


def test_each_batch_line_is_a_span_in_the_batchs_trace(
    redis_url: str, start_worker: Callable[..., Worker], receiver: OtlpReceiver
) -> None:
    start_worker(redis_url, **receiver.env())
    tracer = TracerProvider().get_tracer("agent")
    lines = [
        {"skill": "local/text-tools", "tool": "local/word-count", "arguments": {"text": f"{n} x"}}
        for n in range(5)
    ]
    settings = Settings.from_env({"CLEVERAGENTS_BROKER_URL": redis_url})
    with (
        SkillClient(settings=settings) as client,
        tracer.start_as_current_span("agent batch") as agent,
    ):
        results = list(client.batches.run_many(lines))
    assert all(r.success for r in results)
    spans = _spans(receiver, 5)
    context = agent.get_span_context()
    assert {s.trace_id for s in spans} == {format(context.trace_id, "032x")}
    assert {s.parent_span_id for s in spans} == {format(context.span_id, "016x")}
    assert all(s.attributes["cleveragents.batch_line"] is True for s in spans)


def test_a_sampler_that_drops_every_root_line_makes_no_line_span(
    redis_url: str, start_worker: Callable[..., Worker], receiver: OtlpReceiver
) -> None:
    env = {**receiver.env(), "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0"}
    worker = start_worker(redis_url, **env)
    lines = [
        {"skill": "local/text-tools", "tool": "local/word-count", "arguments": {"text": f"{n}"}}
        for n in range(20)
    ]
    with SkillClient(settings=Settings.from_env({"CLEVERAGENTS_BROKER_URL": redis_url})) as client:
        assert all(r.success for r in client.batches.run_many(lines))
        # A single invocation is still a (dropped) span: nothing is exported either
        assert (
            client.submit("local/text-tools", "local/word-count", {"text": "x"}).result(60).success
        )
    # Once the worker has shut down, every span it made has been sent (its processes
    # flush their spans as they leave)
    worker.shut_down()
    assert receiver.named("execute_tool") == []


def test_an_approved_write_runs_in_its_submitters_trace(
    redis_url: str,
    start_worker: Callable[..., Worker],
    receiver: OtlpReceiver,
    tmp_path: Path,
) -> None:
    start_worker(redis_url, **receiver.env())
    tracer = TracerProvider().get_tracer("agent")
    settings = Settings.from_env({"CLEVERAGENTS_BROKER_URL": redis_url})
    pay = {"log": str(tmp_path / "log"), "key": "k"}
    line = {"skill": "test/approvals", "tool": "test/send-payment", "arguments": pay,
            "allow_writes": True}  # fmt: skip
    batch: list[SkillResult] = []
    with SkillClient(settings=settings) as client:
        # Given a write and a batch line that wait for approval, sent in the agent's trace
        with tracer.start_as_current_span("agent turn") as agent:
            single = client.submit("test/approvals", "test/send-payment", pay, allow_writes=True)
            context = contextvars.copy_context()  # a thread starts with no current span
            lines = threading.Thread(
                target=context.run, args=(lambda: batch.extend(client.batches.run_many([line])),)
            )
            lines.start()
        wait_until(lambda: len(client.approvals.pending()) == 2, 60, "two parked writes")
        # When a person approves them, from a trace of their own
        with tracer.start_as_current_span("approver") as approver:
            for parked in client.approvals.pending():
                assert parked.asked_by  # a batch line too says who sent it
                client.approve(parked.request_id, by="alice")
        assert single.result(timeout=60).success
        lines.join(60)
    assert [r.success for r in batch] == [True]
    # Then each run is a span of the agent's trace, not the approver's
    ran = [s for s in _spans(receiver, 2) if s.status_code != 2]
    ids = {s.attributes["gen_ai.tool.call.id"]: s.trace_id for s in ran}
    assert ids[single.request_id] == format(agent.get_span_context().trace_id, "032x")
    assert set(ids.values()) == {format(agent.get_span_context().trace_id, "032x")}
    assert format(approver.get_span_context().trace_id, "032x") not in set(ids.values())
