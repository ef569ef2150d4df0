"""``skills.invoke``: decode the wire request, call the pipeline, encode the ``SkillResult``."""

from __future__ import annotations

import logging
import os
import time
from functools import partial
from typing import Any

from celery import Task, states
from celery.exceptions import Ignore

from cleveragents.approvals.model import Resolution
from cleveragents.broker.redis.result_backend import RedisBackend
from cleveragents.constants import TASK_INVOKE
from cleveragents.messages import (
    SkillInvocationFailed,
    failure_summary,
    result_payload,
    retry_pending,
)
from cleveragents.pipeline.delivery import ANSWERED, DROPPED, PARKED, RETRY, WAIT, Delivery
from cleveragents.runtime.pauses import pause_clock
from cleveragents.skills import SkillResult
from cleveragents.stores import StartedMark
from cleveragents.tasks.events import tell_flower_later
from cleveragents.tasks.queue_gate import writes_as_queued
from cleveragents.tasks.resend import MAX_LIMIT_WAIT_S, attempt_of, resend, resent_key
from cleveragents.tasks.traced import Recorder, message_carrier, traced_invoke, with_trace_id
from cleveragents.traces.switch import tracing_on
from cleveragents.worker import state
from cleveragents.worker.celery_app import app

__all__ = ["invoke", "origin", "redelivered"]

log = logging.getLogger("cleveragents.worker")


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
    [body] = writes_as_queued(self, [_request_from_args(args, kwargs, task_id)])
    if not tracing_on():
        return _invoke(self, body, task_id)
    return traced_invoke(self, body, task_id, _invoke)


def _invoke(
    self: Task[Any, Any], body: Any, task_id: str, record: Recorder | None = None
) -> dict[str, Any]:
    """Translate the pipeline's one decision about this delivery into Celery's terms."""
    pipeline = state.pipeline(self.app.backend)
    if not task_id:  # not our producer's: run unguarded, nowhere to store a result
        result = pipeline.run(body)
        pipeline.observe(task_id, result)
        return _answer(self, body, result, record)
    clock, began = pause_clock(), time.monotonic()  # the clock: started once per process
    track = self.app.conf.task_track_started
    delivery = Delivery(
        body,
        task_id,
        redelivered=redelivered(self),
        resent=resent_key(self),
        attempt=attempt_of(self),
        asked_by=origin(self),
        trace=message_carrier(self),
        started=_started(self, task_id) if track else None,
        finished_elsewhere=lambda ran: _finished_elsewhere(
            self, task_id, clock.paused_since(began), ran
        ),
    )
    outcome = pipeline.deliver(delivery)
    if outcome.kind == WAIT:  # back to the broker: no process waits for it
        wait = min(outcome.delay_s, MAX_LIMIT_WAIT_S)
        tool = outcome.found.tool.name if outcome.found is not None else "its tool"
        why = f"waiting for the limits of {tool}: asks again in {wait:.1f} s"
        resend(self, wait, retry=False, why=why)
        raise Ignore()
    if outcome.kind == PARKED:  # in the approval store: no process waits for it
        assert outcome.resolution is not None
        _say_parked(self, outcome.resolution)
        if record is not None:
            record(None, "awaiting_approval")
        raise Ignore()
    if outcome.kind == RETRY:
        assert outcome.result is not None
        _retry_later(self, outcome.result, delivery.attempt, outcome.delay_s)
    if outcome.kind == DROPPED or (outcome.kind == ANSWERED and outcome.stored):
        raise Ignore()  # another result stands, and is never overwritten
    assert outcome.result is not None
    return _answer(self, body, outcome.result, record)


def _answer(
    task: Task[Any, Any], body: Any, result: SkillResult, record: Recorder | None
) -> dict[str, Any]:
    """The task's return value (a success), or its failure raised for Flower."""
    payload = result_payload(result, task.request.id or "")
    if record is not None:
        record(result, None)
        payload = with_trace_id(payload)
    if not result.success:
        # Flower shows the summary: argument strings a tool's message quotes are blanked.
        arguments = body.get("arguments") if isinstance(body, dict) else None
        raise SkillInvocationFailed(failure_summary(result, arguments), payload)
    return payload


def _finished_elsewhere(
    task: Task[Any, Any], task_id: str, paused: float, ran: SkillResult
) -> bool:
    """Whether this delivery's result is dropped: its worker was paused while it ran and
    another worker, handed the message meanwhile, has finished the invocation. That
    result stands (the store never overwrites it), and this one is logged as what it is,
    not as the tool's outcome (nor counted again). Asked only when the process was
    paused while it ran (``runtime/pauses.py``)."""
    if paused <= 0:
        return False
    stored = task.app.backend.get_task_meta(task_id).get("status")
    if stored not in states.READY_STATES:
        return False
    log.warning(
        "%s was finished by another worker while this one was paused for %.0f s: its "
        "result (%s) stands; this delivery's (%s) is dropped",
        task_id,
        paused,
        stored,
        "success" if ran.success else f"{ran.error.error_type if ran.error else 'failure'}",
    )
    return True


def origin(task: Task[Any, Any]) -> str | None:
    """Who sent the message, as Celery's ``origin`` header says (process and host)."""
    origin = task.request.origin
    return origin[:200] if isinstance(origin, str) and origin else None


def _say_parked(task: Task[Any, Any], resolution: Resolution) -> None:
    """Flower shows the invocation as awaiting approval, with the command that approves it."""
    record = resolution.record
    if resolution.changed:  # once, when it is parked (not each delivery that finds it)
        log.info(
            "%s (%s / %s) waits for approval until %s: cleveragents approvals approve %s",
            record.request_id,
            record.skill,
            record.tool,
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.expires_at)),
            record.request_id,
        )
    tell_flower_later(
        task,
        "task-awaiting_approval",
        result=f"waits for approval: cleveragents approvals approve {record.request_id}",
    )


def _retry_later(task: Task[Any, Any], result: SkillResult, attempt: int, delay: float) -> None:
    """Send the next attempt back to the broker with ``delay``; this one stores RETRY."""
    task_id = task.request.id or ""
    error = result.error
    said = f" ({error.error_type.value})" if error is not None else ""
    why = f"attempt {attempt} failed{said}; attempt {attempt + 1} in {delay:.1f} s"
    resend(task, delay, retry=True, why=why)
    kind = error.error_type.value if error is not None else None
    pending = retry_pending(attempt, kind, delay)
    task.backend.store_result(task_id, pending, states.RETRY, request=task.request)
    raise Ignore()
