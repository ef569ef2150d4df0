"""``skills.invoke``: decode the wire request, call the runtime, encode the ``SkillResult``."""

from __future__ import annotations

from typing import Any

from celery import Task

from cleveragents.constants import TASK_INVOKE
from cleveragents.guard import run_at_most_once
from cleveragents.runtime import invoke as run_invocation
from cleveragents.runtime.invoke import BeforeWrite
from cleveragents.skills import SkillResult
from cleveragents.wire import SkillInvocationFailed, failure_summary, result_payload
from worker import app, state
from worker.observe import observe

__all__ = ["invoke", "run_request"]


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


def run_request(body: Any, before_write: BeforeWrite | None = None) -> SkillResult:
    """Run one decoded request body through the runtime with this worker's policy."""
    current = state.current()
    return run_invocation(
        body,
        current.catalogue,
        read_only=current.settings.read_only,
        default_timeout_s=current.settings.default_timeout_s,
        max_timeout_s=current.settings.max_timeout_s,
        before_write=before_write,
    )


@app.task(
    name=TASK_INVOKE,
    bind=True,
    typing=False,  # the runtime, not Celery, judges the arguments
    throws=(SkillInvocationFailed,),  # an expected failure: logged on one line, no traceback
    Request="tasks.request:RedactingRequest",  # Flower never sees argument values
)
def invoke(self: Task[Any, Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Run one skill invocation; a failed one is raised so Flower shows it as failed."""
    task_id = self.request.id or ""
    body = _request_from_args(args, kwargs, task_id)
    guard = state.guard(self.app.backend)
    redelivered = bool((self.request.delivery_info or {}).get("redelivered"))
    result = (
        run_at_most_once(guard, task_id, body, run_request, redelivered=redelivered)
        if task_id
        else run_request(body)
    )
    observe(self.app.backend, task_id, result)
    payload = result_payload(result, task_id)
    if not result.success:
        raise SkillInvocationFailed(failure_summary(result), payload)
    return payload
