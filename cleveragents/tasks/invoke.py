"""``skills.invoke``: decode the wire request, call the pipeline, encode the ``SkillResult``."""

from __future__ import annotations

import os
from functools import partial
from typing import Any

from celery import Task, states
from celery.exceptions import Ignore

from cleveragents.broker.redis.result_backend import RedisBackend
from cleveragents.constants import TASK_INVOKE
from cleveragents.messages import SkillInvocationFailed, failure_summary, result_payload
from cleveragents.pipeline import execute
from cleveragents.pipeline.binding import REASON_CANCELLED, REASON_REUSED
from cleveragents.stores import StartedMark
from cleveragents.worker import state
from cleveragents.worker.celery_app import app

__all__ = ["invoke", "redelivered"]


def _request_from_args(args: tuple[Any, ...], kwargs: dict[str, Any], task_id: str) -> Any:
    # The body is one JSON object; anything else is left for the runtime to reject
    # with a validation_error. The task id is the request id, whatever the body says.
    if len(args) == 1 and not kwargs and isinstance(args[0], dict):
        body = dict(args[0])
        if task_id:
            body["request_id"] = task_id
        return body
    if not args and kwargs:
        return {**kwargs, "request_id": task_id} if task_id else kwargs
    return args


def _started(task: Task[Any, Any], task_id: str) -> StartedMark:
    """STARTED as Celery's tracer would store it (``task_track_started``), for this id only;
    encoded too on Redis, where it is stored in the round trip that binds the id."""
    meta = {"pid": os.getpid(), "hostname": task.request.hostname}
    backend = task.backend
    write = partial(backend.store_result, task_id, meta, states.STARTED, request=task.request)
    if not isinstance(backend, RedisBackend):
        return StartedMark(write)
    key, value, ttl = backend.encoded_state(task_id, meta, states.STARTED, request=task.request)
    return StartedMark(write, key, value, ttl)


def redelivered(task: Task[Any, Any]) -> bool:
    """Whether the broker marked the task's message as delivered before."""
    return bool((task.request.delivery_info or {}).get("redelivered"))


@app.task(
    name=TASK_INVOKE,
    bind=True,
    typing=False,  # the runtime, not Celery, judges the arguments
    throws=(SkillInvocationFailed,),  # an expected failure: logged on one line, no traceback
    Request="cleveragents.tasks.task_request:RedactingRequest",  # Flower never sees argument values
    # STARTED is stored with the id's bind, once the id is known to be this request's:
    # Celery's tracer stores it before the task runs, over another request's failure.
    track_started=False,
)
def invoke(self: Task[Any, Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Run one skill invocation; a failed one is raised so Flower shows it as failed."""
    task_id = self.request.id or ""
    body = _request_from_args(args, kwargs, task_id)
    pipeline = state.pipeline(self.app.backend)
    track = task_id and self.app.conf.task_track_started
    started = _started(self, task_id) if track else None
    answer = pipeline.answered(body, task_id, started) if task_id else None
    if answer is not None:
        reason = answer.error.details.get("reason") if answer.error is not None else None
        if reason == REASON_CANCELLED:  # stored as its result: whoever waits is answered
            pipeline.observe(task_id, answer)
            raise SkillInvocationFailed(
                failure_summary(answer, None), result_payload(answer, task_id)
            )
        # Its id answers another request, or this one already: nothing runs, and the
        # stored result is never overwritten (Ignore stores no state).
        if reason == REASON_REUSED:
            pipeline.observe(task_id, answer)
        raise Ignore()
    result = execute(pipeline, body, request_id=task_id, redelivered=redelivered(self))
    payload = result_payload(result, task_id)
    if not result.success:
        # Flower shows the summary: argument strings a tool's message quotes are blanked.
        arguments = body.get("arguments") if isinstance(body, dict) else None
        raise SkillInvocationFailed(failure_summary(result, arguments), payload)
    return payload
