"""``skills.invoke`` inside its span, where the worker traces (``cleveragents.traces``).

The message's trace context (its ``traceparent`` and ``tracestate`` headers) is made
current, and the invocation runs inside its ``execute_tool`` span, with the time
it waited in the queue and its attempt; its stored result carries the trace id.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from celery import Task

from cleveragents.constants import SENT_AT_HEADER
from cleveragents.runtime.outcomes import names_of
from cleveragents.skills import SkillResult
from cleveragents.tasks.resend import attempt_of
from cleveragents.traces.carriers import TRACE_HEADERS, carrier_of, current_trace_id

__all__ = ["Recorder", "message_carrier", "traced_invoke", "with_trace_id"]

#: Records how the invocation ended on its span: its result, or what happened instead.
Recorder = Callable[[SkillResult | None, str | None], None]
#: The task body run inside the span.
Run = Callable[[Task[Any, Any], Any, str, Recorder], dict[str, Any]]


def message_carrier(task: Task[Any, Any]) -> dict[str, str]:
    """The trace context the task's message carries (checked; {} for none)."""
    request = task.request
    return carrier_of({name: getattr(request, name, None) for name in TRACE_HEADERS})


def _queue_wait_ms(task: Task[Any, Any]) -> float | None:
    sent = getattr(task.request, SENT_AT_HEADER, None)
    if isinstance(sent, bool) or not isinstance(sent, int | float):
        return None
    return round(max(0.0, time.time() - float(sent)) * 1000, 1)


def traced_invoke(task: Task[Any, Any], body: Any, task_id: str, run: Run) -> dict[str, Any]:
    """``run`` the invocation inside its span, in the trace of its message."""
    from cleveragents.traces import otel  # only where this process traces

    skill, tool = names_of(body)
    with (
        otel.attached(message_carrier(task)),
        otel.tool_span(
            skill, tool, task_id, attempt=attempt_of(task), queue_wait_ms=_queue_wait_ms(task)
        ) as record,
    ):
        return run(task, body, task_id, record)


def with_trace_id(payload: dict[str, Any]) -> dict[str, Any]:
    """The stored result with the trace id of its span: a person jumps from it to the trace."""
    trace_id = current_trace_id()
    return {**payload, "trace_id": trace_id} if trace_id else payload
