"""``skills.invoke``: decode the wire request, call the pipeline, encode the ``SkillResult``."""

from __future__ import annotations

import logging
import os
import time
from functools import partial
from typing import Any

from celery import Task, states
from celery.exceptions import Ignore, Retry

from cleveragents.approvals.model import AwaitingApproval
from cleveragents.broker.redis.result_backend import RedisBackend
from cleveragents.constants import TASK_INVOKE
from cleveragents.messages import SkillInvocationFailed, failure_summary, result_payload
from cleveragents.pipeline import Pipeline
from cleveragents.pipeline.binding import REASON_CANCELLED, REASON_REUSED
from cleveragents.pipeline.retries import retried, retry_delay_s, with_attempts
from cleveragents.runtime.pauses import pause_clock
from cleveragents.skills import SkillResult
from cleveragents.skills.catalogue import ToolPolicies
from cleveragents.stores import StartedMark
from cleveragents.stores.quotas import Permit
from cleveragents.tasks.events import tell_flower_later
from cleveragents.tasks.queue_gate import writes_as_queued
from cleveragents.tasks.resend import MAX_LIMIT_WAIT_S, attempt_of, resend, resent_key
from cleveragents.tasks.traced import Recorder, message_carrier, traced_invoke, with_trace_id
from cleveragents.traces.switch import tracing_on
from cleveragents.worker import state
from cleveragents.worker.celery_app import app

__all__ = ["invoke", "origin", "redelivered"]

log = logging.getLogger("cleveragents.worker")
#: Ids whose delivery in this process returned another run's finished write (``_run``).
_elsewhere: set[str] = set()


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
    pipeline = state.pipeline(self.app.backend)
    found = pipeline.policy_tool(body) if task_id else None
    permits = _permits(self, pipeline, found)
    clock, began = pause_clock(), time.monotonic()  # the clock: started once per process
    try:
        result = _run(self, pipeline, body, task_id)
        elsewhere = task_id in _elsewhere
        _elsewhere.discard(task_id)
    except AwaitingApproval as parked:  # in the approval store: no process waits for it
        _say_parked(self, parked)
        if record is not None:
            record(None, "awaiting_approval")
        raise Ignore() from None
    finally:
        for permit in permits:
            permit.release()
    if task_id and clock.paused_since(began) > 0:
        _finished_elsewhere(self, task_id, clock.paused_since(began), result)
    tool = found.tool if found is not None else None
    attempt = attempt_of(self)
    if tool is not None and tool.retry is not None:
        delay = retry_delay_s(tool, result, attempt)
        if delay is not None:  # back to the broker: no process waits for it
            _retry_later(self, pipeline, result, attempt, delay)
    if not _cancelled(result):
        result = with_attempts(result, attempt)
    if not elsewhere:
        pipeline.observe(task_id, result)
    payload = result_payload(result, task_id)
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
) -> None:
    """Drop this delivery's result when its worker was paused while it ran and another
    worker, handed the message meanwhile, has finished the invocation: that result
    stands (the store never overwrites it), and this one is logged as what it is, not
    as the tool's outcome (nor counted again). Asked only when the process was paused
    while it ran (``runtime/pauses.py``).

    Raises:
        Ignore: another delivery's result is stored.
    """
    stored = task.app.backend.get_task_meta(task_id).get("status")
    if stored not in states.READY_STATES:
        return
    log.warning(
        "%s was finished by another worker while this one was paused for %.0f s: its "
        "result (%s) stands; this delivery's (%s) is dropped",
        task_id,
        paused,
        stored,
        "success" if ran.success else f"{ran.error.error_type if ran.error else 'failure'}",
    )
    raise Ignore()


def _permits(task: Task[Any, Any], pipeline: Pipeline, found: ToolPolicies | None) -> list[Permit]:
    """Places under the tool's fleet-wide limits; over them, the message goes back to the
    broker to wait (the pool process takes the next one) and nothing else happens."""
    if found is None or not found.limited:
        return []
    taken = pipeline.take_limits(found)
    if isinstance(taken, float):
        wait = min(taken, MAX_LIMIT_WAIT_S)
        why = f"waiting for the limits of {found.tool.name}: asks again in {wait:.1f} s"
        resend(task, wait, retry=False, why=why)
        raise Ignore()
    return taken


def _run(task: Task[Any, Any], pipeline: Pipeline, body: Any, task_id: str) -> SkillResult:
    """The delivery's result: an answer that needs no run, or the run's (not observed)."""
    track = task_id and task.app.conf.task_track_started
    started = _started(task, task_id) if track else None
    answer = pipeline.answered(body, task_id, started) if task_id else None
    if answer is None:
        if not task_id:
            return pipeline.run(body)
        delivered = pipeline.run_delivery(
            body,
            task_id,
            redelivered=redelivered(task),
            resent=resent_key(task),
            asked_by=origin(task),
            trace=message_carrier(task),
        )
        if delivered.elsewhere:  # another run's write, counted and logged by that run
            _elsewhere.add(task_id)
        return delivered.result
    reason = answer.error.details.get("reason") if answer.error is not None else None
    if reason == REASON_CANCELLED:  # stored as its result: whoever waits is answered
        return answer
    # Its id answers another request, or this one already: nothing runs, and the
    # stored result is never overwritten (Ignore stores no state).
    if reason == REASON_REUSED:
        pipeline.observe(task_id, answer)
    raise Ignore()


def origin(task: Task[Any, Any]) -> str | None:
    """Who sent the message, as Celery's ``origin`` header says (process and host)."""
    origin = task.request.origin
    return origin[:200] if isinstance(origin, str) and origin else None


def _say_parked(task: Task[Any, Any], parked: AwaitingApproval) -> None:
    """Flower shows the invocation as awaiting approval, with the command that approves it."""
    record = parked.resolution.record
    if parked.resolution.changed:  # once, when it is parked (not each delivery that finds it)
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


def _cancelled(result: SkillResult) -> bool:
    return result.error is not None and result.error.details.get("reason") == REASON_CANCELLED


def _retry_later(
    task: Task[Any, Any], pipeline: Pipeline, result: SkillResult, attempt: int, delay: float
) -> None:
    """Send the next attempt back to the broker with ``delay``; this one stores RETRY."""
    task_id = task.request.id or ""
    pipeline.observe(task_id, retried(result, attempt))
    error = result.error
    said = f" ({error.error_type.value})" if error is not None else ""
    why = f"attempt {attempt} failed{said}; attempt {attempt + 1} in {delay:.1f} s"
    resend(task, delay, retry=True, why=why)
    task.backend.store_result(task_id, Retry(why), states.RETRY, request=task.request)
    raise Ignore()
