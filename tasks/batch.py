"""``skills.invoke_chunk``: many invocations in one message, each with its own stored result.

The pipeline (``cleveragents.pipeline.execute_chunk``) runs the chunk for one time
slice and stores each result under its own request id; this task decodes the
message and sends the rest of the chunk back to the end of its queue.
"""

from __future__ import annotations

import time
from typing import Any

from celery import Task

from cleveragents.constants import QUEUE_BATCH, SENT_AT_HEADER, TASK_INVOKE_CHUNK
from cleveragents.pipeline import execute_chunk
from cleveragents.wire import chunk_repr
from tasks.invoke import redelivered
from worker import app, state

__all__ = ["invoke_chunk"]


@app.task(
    name=TASK_INVOKE_CHUNK,
    bind=True,
    typing=False,
    ignore_result=True,  # every invocation's result is stored under its own id instead
    Request="tasks.request:RedactingRequest",
)
def invoke_chunk(self: Task[Any, Any], /, requests: Any = None, **_: Any) -> dict[str, int]:
    """Run the chunk's requests for one time slice, storing each result; requeue the rest."""
    report = execute_chunk(
        state.pipeline(self.app.backend),
        requests if isinstance(requests, list) else [],
        chunk_id=self.request.id or "",
        redelivered=redelivered(self),
        requeue=lambda rest: _requeue(self, rest),
    )
    return report.as_dict()


def _requeue(task: Task[Any, Any], rest: list[Any]) -> None:
    queue = (task.request.delivery_info or {}).get("routing_key") or QUEUE_BATCH
    sent_at = getattr(task.request, SENT_AT_HEADER, None) or time.time()
    task.app.send_task(
        TASK_INVOKE_CHUNK,
        args=[rest],
        queue=queue,
        argsrepr=chunk_repr(rest),
        kwargsrepr="{}",
        ignore_result=True,
        headers={SENT_AT_HEADER: sent_at},  # its age counts from the first submission
    )
