"""The spans of invocations, with OpenTelemetry: imported only where tracing is on (``switch.py``).

Each invocation is one span, ``execute_tool {tool}``, in the trace its message
names (W3C ``traceparent``), a child of the producer's span: the GenAI semantic
conventions' attributes (``gen_ai.operation.name``, ``gen_ai.tool.name``,
``gen_ai.tool.call.id``), ``cleveragents.skill``, how long it waited in the queue
and which attempt it is; on failure status ERROR and ``error.type`` (the error
type), with the refusal's gate or reason. Never an argument value, an output or a
tool's message: they may hold secrets.

The provider is built from the standard variables (``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER[_ARG]``, ``OTEL_BSP_*``, and the
exporter's own ``OTEL_EXPORTER_OTLP_*``), once per process: a pool process builds
its own after the fork (the batch processor's thread does not survive one).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
)
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import SpanKind, Status, StatusCode

from cleveragents.skills import SkillResult
from cleveragents.traces.switch import exporter_name

__all__ = ["attached", "carrier", "flush", "line_span", "tool_span", "trace_id"]

_lock = threading.Lock()
_provider: TracerProvider | None = None
_tracer_of_pid: trace.Tracer | None = None
_pid = 0


def _processor() -> SpanProcessor:
    """Console spans are written as each ends (a debugging aid, read in the worker's
    log: a batch would die with a local worker stopped milliseconds after its last
    result); OTLP spans are batched."""
    name = exporter_name(os.environ)
    if name == "console":
        return SimpleSpanProcessor(ConsoleSpanExporter())
    if name != "otlp":
        raise ValueError(f"OTEL_TRACES_EXPORTER={name!r}: this extra exports otlp or console")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return BatchSpanProcessor(OTLPSpanExporter())


class _PresetTraceIds(RandomIdGenerator):
    """Random ids, but for a trace id chosen before its span starts (``line_span``): the
    span the sampler was asked about gets the trace id it was asked about."""

    def __init__(self) -> None:
        self.preset = threading.local()

    def generate_trace_id(self) -> int:
        chosen: int | None = getattr(self.preset, "trace_id", None)
        if chosen is None:
            return super().generate_trace_id()
        self.preset.trace_id = None
        return chosen


_ids = _PresetTraceIds()


def _tracer() -> trace.Tracer:
    global _provider, _tracer_of_pid, _pid
    if _tracer_of_pid is None or _pid != os.getpid():
        with _lock:
            if _tracer_of_pid is None or _pid != os.getpid():
                provider = TracerProvider(id_generator=_ids)
                provider.add_span_processor(_processor())
                _provider, _pid = provider, os.getpid()
                _tracer_of_pid = provider.get_tracer("cleveragents")
    return _tracer_of_pid


def flush(timeout_ms: int = 5000) -> None:
    """Send this process's finished spans now (a pool process about to exit)."""
    if _provider is not None and _pid == os.getpid():
        _provider.force_flush(timeout_ms)


@contextmanager
def attached(headers: Mapping[str, str] | None) -> Iterator[None]:
    """Make the trace context of ``headers`` the current one (nothing when it has none)."""
    if not headers:
        yield
        return
    token = otel_context.attach(propagate.extract(dict(headers)))
    try:
        yield
    finally:
        otel_context.detach(token)


def carrier() -> dict[str, str]:
    """The current trace context as W3C fields (``traceparent``, ``tracestate``)."""
    fields: dict[str, str] = {}
    propagate.inject(fields)
    return fields


def trace_id() -> str | None:
    """The current span's trace id (32 hex digits), or None outside a recorded span."""
    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None


class tool_span:
    """The span of one invocation, a child of the current context; current while it
    runs when it is recorded (sampled). The caller records how it ended with the
    function ``with`` yields: a result, or what happened instead (``awaiting_approval``).

    A class, not a generator: a batch line's span costs a few microseconds when the
    sampler drops it (``benchmarks/compare.py --trace-sample``).
    """

    __slots__ = ("span", "token")

    def __init__(self, skill: str, tool: str, request_id: str, **extra: Any) -> None:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool,
            "gen_ai.tool.call.id": request_id,
            "cleveragents.skill": skill,
        }
        for key, value in extra.items():
            if value is not None:
                attributes[f"cleveragents.{key}"] = value
        self.span = _tracer().start_span(
            f"execute_tool {tool}", kind=SpanKind.INTERNAL, attributes=attributes
        )
        self.token: object = None

    def __enter__(self) -> Callable[[SkillResult | None, str | None], None]:
        if self.span.is_recording():
            self.token = otel_context.attach(trace.set_span_in_context(self.span))
        return self.record

    def record(self, result: SkillResult | None, outcome: str | None) -> None:
        if self.span.is_recording():
            _record(self.span, result, outcome)

    def __exit__(self, *_: object) -> None:
        # An exception's message (a tool's words, perhaps quoting its arguments) is never
        # recorded: a failure's status and type come from its result.
        if self.token is not None:
            otel_context.detach(self.token)  # type: ignore[arg-type]
        self.span.end()


def _record(span: Any, result: SkillResult | None, outcome: str | None) -> None:
    if outcome is not None:
        span.set_attribute("cleveragents.outcome", outcome)
    if result is None:
        return
    error = result.error
    if error is None:
        return
    span.set_status(Status(StatusCode.ERROR))
    span.set_attribute("error.type", error.error_type.value)
    for key in ("reason", "gate"):
        value = error.details.get(key)
        if isinstance(value, str):
            span.set_attribute(f"cleveragents.{key}", value)
    attempts = error.details.get("attempts")
    if isinstance(attempts, int):
        span.set_attribute("cleveragents.attempts", attempts)


class _Dropped:
    """A batch line the sampler drops: no span at all, nothing recorded."""

    def __enter__(self) -> Callable[[SkillResult | None, str | None], None]:
        return _ignore

    def __exit__(self, *_: object) -> None:
        return None


def _ignore(result: SkillResult | None, outcome: str | None) -> None:
    return None


_DROPPED = _Dropped()


def line_span(skill: str, tool: str, request_id: str) -> tool_span | _Dropped:
    """A batch line's span, if the configured sampler keeps it; the sampler is asked
    first, so that a dropped line costs about a microsecond, not a span's making."""
    tracer = _tracer()
    assert _provider is not None
    parent = otel_context.get_current()
    above = trace.get_current_span(parent).get_span_context()
    trace_id = above.trace_id if above.is_valid else _ids.generate_trace_id()
    kept = _provider.sampler.should_sample(parent, trace_id, f"execute_tool {tool}")
    if not kept.decision.is_sampled():  # type: ignore[no-untyped-call]
        return _DROPPED
    if not above.is_valid:
        _ids.preset.trace_id = trace_id  # the span gets the trace id the sampler kept
    del tracer
    return tool_span(skill, tool, request_id, batch_line=True)
