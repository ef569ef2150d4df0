"""``skills.invoke_chunk``: many invocations in one message, each with its own stored result.

Each request still gets its own gating, validation and timeout (the runtime), and
its own ``SkillResult`` under its own request id. A request whose result is
already stored (a redelivered chunk, a resumed batch) is not run again.
"""

from __future__ import annotations

import time
from typing import Any

from celery import Task

from cleveragents.constants import QUEUE_BATCH, TASK_INVOKE_CHUNK
from cleveragents.results import ResultStore
from cleveragents.skills import SkillResult
from cleveragents.wire import chunk_repr
from tasks.invoke import run_request
from worker import app

__all__ = ["invoke_chunk"]

#: A chunk runs for at most about this long before the rest of it is requeued.
SLICE_S = 0.02
#: Results are written at least every this many invocations.
FLUSH_EVERY_N = 250


def _request_id(body: Any) -> str | None:
    value = body.get("request_id") if isinstance(body, dict) else None
    return value if isinstance(value, str) and value else None


@app.task(
    name=TASK_INVOKE_CHUNK,
    bind=True,
    typing=False,
    ignore_result=True,  # every invocation's result is stored under its own id instead
    Request="tasks.request:RedactingRequest",
)
def invoke_chunk(self: Task[Any, Any], /, requests: Any = None, **_: Any) -> dict[str, int]:
    """Run the chunk's requests for one time slice, storing each result; requeue the rest.

    After ``SLICE_S`` the requests not yet run go back to the end of the chunk's
    queue as a new message, so that the process turns to other queues in between:
    an interactive invocation never waits behind a whole chunk.
    """
    bodies = requests if isinstance(requests, list) else []
    store = ResultStore(self.app.backend)
    done = store.existing([rid for rid in map(_request_id, bodies) if rid is not None])
    pending: list[tuple[str, SkillResult]] = []
    ran = skipped = 0
    started = time.monotonic()
    for index, body in enumerate(bodies):
        if index and time.monotonic() - started > SLICE_S:
            store.put_many(pending)
            _requeue(self, bodies[index:])
            break
        rid = _request_id(body)
        if rid is None or rid in done:
            skipped += 1  # no id to store a result under, or already finished
            continue
        done.add(rid)  # the same id twice in one chunk runs once
        pending.append((rid, run_request(body)))
        ran += 1
        if len(pending) >= FLUSH_EVERY_N:
            store.put_many(pending)
            pending = []
    else:
        store.put_many(pending)
    return {"invocations": len(bodies), "ran": ran, "skipped": skipped}


def _requeue(task: Task[Any, Any], rest: list[Any]) -> None:
    queue = (task.request.delivery_info or {}).get("routing_key") or QUEUE_BATCH
    task.app.send_task(
        TASK_INVOKE_CHUNK,
        args=[rest],
        queue=queue,
        argsrepr=chunk_repr(rest),
        kwargsrepr="{}",
        ignore_result=True,
    )
