"""``skills.invoke_chunk``: many invocations in one message, each with its own stored result.

The pipeline (``cleveragents.pipeline.execute_chunk``) runs the chunk for one time
slice and stores each result under its own request id; this task decodes the
message and sends the rest of the chunk back to the end of its queue, as the
messages the pipeline sized by time, when an interactive invocation waits for
the process (``cleveragents/broker/interactive_waiting.py``; else the chunk runs on,
``STAY_S`` at most).
Flower shows the chunk by its skills and tools, batch id and item numbers
(``chunk_repr``), its result with the counts, and each failed invocation as its
own row (``cleveragents.tasks.events``).
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

from celery import Task

from cleveragents.broker.interactive_waiting import interactive_waiting
from cleveragents.constants import (
    BATCH_HEADER,
    QUEUE_BATCH,
    SENT_AT_HEADER,
    TASK_INVOKE,
    TASK_INVOKE_CHUNK,
)
from cleveragents.messages import ChunkContext, chunk_repr, redacted_repr
from cleveragents.pipeline import Sender, execute_chunk
from cleveragents.tasks.events import ItemEvents
from cleveragents.tasks.invoke import origin, redelivered
from cleveragents.tasks.queue_gate import writes_as_queued
from cleveragents.tasks.resend import MAX_LIMIT_WAIT_S, WAITS_HEADER
from cleveragents.tasks.traced import message_carrier
from cleveragents.traces.switch import tracing_on
from cleveragents.worker import state
from cleveragents.worker.celery_app import app

__all__ = ["invoke_chunk"]


@app.task(
    name=TASK_INVOKE_CHUNK,
    bind=True,
    typing=False,
    ignore_result=True,  # every invocation's result is stored under its own id instead
    Request="cleveragents.tasks.task_request:RedactingRequest",
)
def invoke_chunk(self: Task[Any, Any], /, requests: Any = None, **_: Any) -> dict[str, Any]:
    """Run the chunk's requests for one time slice, storing each result; requeue the rest.

    Returns what Flower shows as the chunk's result: its batch and items, then what
    the slice did (``{'batch': ID, 'items': '101-200 of 1000', 'invocations': 100,
    'ran': 100, 'skipped': 0, 'failed': 3, 'requeued': 0}``).
    """
    bodies = writes_as_queued(self, requests if isinstance(requests, list) else [])
    context = ChunkContext.from_header(getattr(self.request, BATCH_HEADER, None), len(bodies))
    failures = ItemEvents(self, context)
    requeued: list[int] = []

    def requeue(rest: list[Any], start: int, rest_id: str) -> None:
        requeued.append(len(rest))
        _requeue(self, rest, context, start, rest_id)

    run = partial(
        execute_chunk,
        state.pipeline(self.app.backend),
        bodies,
        chunk_id=self.request.id or "",
        redelivered=redelivered(self),
        requeue=requeue,
        report_failures=failures,
        others_waiting=interactive_waiting(self.app),
        defer=partial(_defer, self),
        sender=Sender(origin(self), message_carrier(self)),
    )
    if tracing_on():  # each line a span in the trace the chunk's message names
        from cleveragents.traces import otel

        with otel.attached(message_carrier(self)):
            report = run()
    else:
        report = run()
    place = {} if context is None else context.summary()
    return {**place, **report.as_dict(), "failed": failures.failed, "requeued": sum(requeued)}


def _requeue(
    task: Task[Any, Any], rest: list[Any], context: ChunkContext | None, start: int, rest_id: str
) -> None:
    queue = (task.request.delivery_info or {}).get("routing_key") or QUEUE_BATCH
    sent_at = getattr(task.request, SENT_AT_HEADER, None) or time.time()
    headers: dict[str, Any] = {SENT_AT_HEADER: sent_at, **message_carrier(task)}  # its age
    # counts from the first sending; it stays in the chunk's trace
    rest_context = None if context is None else context.rest(start, len(rest))
    if rest_context is not None:
        headers[BATCH_HEADER] = rest_context.header()
    task.app.send_task(
        TASK_INVOKE_CHUNK,
        args=[rest],
        task_id=rest_id,
        queue=queue,
        argsrepr=chunk_repr(rest, rest_context),
        kwargsrepr="{}",
        ignore_result=True,
        headers=headers,
    )


def _defer(task: Task[Any, Any], body: Any, request_id: str, delay_s: float, retry: bool) -> None:
    """Send one line back on its own, as a ``skills.invoke`` under its id: its retry
    (attempt 2), or the same attempt after a wait (for its tool's limits, or for its
    write's first run, which may still go on elsewhere)."""
    queue = (task.request.delivery_info or {}).get("routing_key") or QUEUE_BATCH
    task.app.send_task(
        TASK_INVOKE,
        args=[body],
        task_id=request_id,
        queue=queue,
        countdown=max(0.0, min(delay_s, MAX_LIMIT_WAIT_S) if not retry else delay_s),
        retries=1 if retry else 0,
        headers={WAITS_HEADER: 0 if retry else 1, **message_carrier(task)},
        argsrepr=redacted_repr(body) if isinstance(body, dict) else "[redacted]",
        kwargsrepr="{}",
    )
