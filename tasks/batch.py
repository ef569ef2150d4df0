"""``skills.invoke_chunk``: many invocations in one message, each with its own stored result.

Each request still gets its own gating, validation and timeout (the runtime), and
its own ``SkillResult`` under its own request id. A request whose result is
already stored (a redelivered chunk, a resumed batch) is not run again.
"""

from __future__ import annotations

import time
from typing import Any

from celery import Task

from cleveragents.constants import QUEUE_BATCH, SENT_AT_HEADER, TASK_INVOKE_CHUNK
from cleveragents.guard import run_at_most_once
from cleveragents.results import ResultStore
from cleveragents.skills import SkillResult
from cleveragents.wire import chunk_repr
from tasks.invoke import run_request
from worker import app, state
from worker.observe import observe

__all__ = ["invoke_chunk"]

#: A chunk runs for at most about this long before the rest of it is requeued.
SLICE_S = 0.02
#: Results are written at least every this many invocations.
FLUSH_EVERY_N = 250
#: Requests whose stored results are looked up at once (the slice may end before the rest).
CHECK_EVERY_N = 32


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
    guard = state.guard(self.app.backend)
    # A chunk delivered again (its worker process died) may hold the invocation that
    # killed it: then every invocation counts its own deliveries, so that one ends.
    careful = bool((self.request.delivery_info or {}).get("redelivered"))
    if guard.redis is None and self.request.id:  # the embedded transport marks no redelivery
        careful = guard.attempt(f"chunk:{self.request.id}") > 1
    pending: list[tuple[str, SkillResult]] = []
    seen: set[str] = set()
    ran = skipped = 0
    started = time.monotonic()
    for start in range(0, len(bodies), CHECK_EVERY_N):
        if start and time.monotonic() - started > SLICE_S:
            store.put_many(pending)
            _requeue(self, bodies[start:])
            return {"invocations": len(bodies), "ran": ran, "skipped": skipped}
        group = bodies[start : start + CHECK_EVERY_N]
        for body, finished in zip(group, _finished(store, group), strict=True):
            rid = _request_id(body)
            if rid is None or finished or rid in seen:
                skipped += 1  # no id to store a result under, or already finished
                continue
            seen.add(rid)  # the same id twice in one chunk runs once
            result = run_at_most_once(
                guard, rid, body, run_request, redelivered=careful, chunk_item=True
            )
            observe(self.app.backend, rid, result)
            pending.append((rid, result))
            ran += 1
            if careful:
                # A chunk that came back may hold the invocation that kills its process:
                # store each result at once, so that only that one is ever run again.
                store.put_many(pending)
                pending = []
        if len(pending) >= FLUSH_EVERY_N:
            store.put_many(pending)
            pending = []
    store.put_many(pending)
    return {"invocations": len(bodies), "ran": ran, "skipped": skipped}


def _finished(store: ResultStore, bodies: list[Any]) -> list[bool]:
    ids = [_request_id(body) for body in bodies]
    known = [(i, rid) for i, rid in enumerate(ids) if rid is not None]
    payloads = store.reusable(
        [rid for _, rid in known],
        [
            bool(isinstance(bodies[i], dict) and bodies[i].get("allow_writes") is True)
            for i, _ in known
        ],
    )
    finished = [False] * len(bodies)
    for (i, _), payload in zip(known, payloads, strict=True):
        finished[i] = payload is not None
    return finished


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
