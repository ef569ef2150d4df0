"""How requests and results travel through Celery: payloads, redaction, failures.

A successful invocation is stored as the task's return value: the
``SkillResult`` fields plus ``request_id``. A failed one is raised as
``SkillInvocationFailed`` so that Celery, Flower and ``celery events`` show it
as failed; the exception carries the whole ``SkillResult`` as its second
argument, and ``result_from_stored`` rebuilds it from either form.
"""

from __future__ import annotations

from typing import Any

from cleveragents.constants import REDACTED
from cleveragents.error_types import SkillErrorType
from cleveragents.outcomes import failed_result
from cleveragents.runtime.request import SkillInvocationRequest
from cleveragents.skills import SkillResult

__all__ = [
    "WIRE_MODULE",
    "SkillInvocationFailed",
    "chunk_repr",
    "failure_summary",
    "redacted_repr",
    "request_payload",
    "result_from_stored",
    "result_payload",
    "stored_payload",
]


#: The module Celery records as the failure's ``exc_module``.
WIRE_MODULE = __name__
#: The exception Celery stores for a task its hard time limit ended (billiard's class).
_TIME_LIMIT = "TimeLimitExceeded"


class SkillInvocationFailed(Exception):
    """Raised by the task for a failed invocation: Celery marks it FAILURE.

    ``args`` is ``(summary, payload)``: a one-line ``"error_type: message"`` and the
    full ``SkillResult`` payload.
    """

    def __init__(self, summary: str, payload: dict[str, Any] | None = None) -> None:
        super().__init__(summary, payload or {})
        self.summary = summary
        self.payload = payload or {}

    def __str__(self) -> str:
        return self.summary

    def __repr__(self) -> str:
        return f"SkillInvocationFailed({self.summary!r})"


def request_payload(request: SkillInvocationRequest) -> dict[str, Any]:
    """The JSON body of one invocation (SPEC section 5)."""
    return request.model_dump(mode="json")


def redacted_repr(request: SkillInvocationRequest | dict[str, Any]) -> str:
    """What Flower and logs show of a request: everything but the arguments' values."""
    data = (
        request.model_dump(mode="json") if isinstance(request, SkillInvocationRequest) else request
    )
    # Skill and tool first: Flower's tasks table shows the start of this text.
    shown: dict[str, Any] = {k: data[k] for k in ("skill", "tool") if k in data}
    arguments = data.get("arguments")
    if isinstance(arguments, dict):
        shown["arguments"] = {key: REDACTED for key in arguments}
    elif arguments is not None:
        shown["arguments"] = REDACTED
    shown.update({k: v for k, v in data.items() if k not in shown and k != "arguments"})
    return repr((shown,))


def chunk_repr(bodies: list[Any]) -> str:
    """What Flower shows of a batch chunk: how many invocations, of which tools."""
    tools = sorted({f"{b.get('skill')} {b.get('tool')}" for b in bodies if isinstance(b, dict)})
    shown = ", ".join(tools[:3]) + (f", +{len(tools) - 3} more" if len(tools) > 3 else "")
    return f"({len(bodies)} invocations: {shown}; arguments {REDACTED})"


def result_payload(result: SkillResult, request_id: str) -> dict[str, Any]:
    """A ``SkillResult`` as stored: its fields plus ``request_id``."""
    payload = result.model_dump(mode="json")
    payload["request_id"] = request_id
    return payload


def failure_summary(result: SkillResult) -> str:
    """``error_type: message`` of a failed result, on one line."""
    error = result.error
    if error is None:
        return "failed"
    return f"{error.error_type}: {error.message}".replace("\n", " ")


def _unreadable(request_id: str, why: str) -> dict[str, Any]:
    result = failed_result(
        "", "", SkillErrorType.TOOL_EXECUTION_FAILURE, why, {"request_id": request_id}
    )
    return result_payload(result, request_id)


def _hard_time_limit(request_id: str, args: Any) -> dict[str, Any]:
    """Celery's own record of a task its hard time limit ended (a worker without our handler)."""
    limit = args[0] if isinstance(args, list | tuple) and args else None
    details: dict[str, Any] = {"reason": "timeout", "exception_type": "TimeLimitExceeded"}
    if isinstance(limit, int | float) and not isinstance(limit, bool):
        details["hard_limit_s"] = limit
    details["request_id"] = request_id
    result = failed_result(
        "",
        "",
        SkillErrorType.TOOL_EXECUTION_FAILURE,
        "the tool did not stop at its timeout: its worker process was ended by the hard "
        "time limit",
        details,
    )
    return result_payload(result, request_id)


def stored_payload(value: Any, request_id: str = "") -> dict[str, Any]:
    """The ``SkillResult`` payload in what Celery stored: a return value or a failure.

    The one decoder of stored failure envelopes: ``SkillInvocationFailed`` (as
    raised, as rebuilt by Celery under another class, or as its stored
    ``exc_type``/``exc_message`` dict), Celery's ``TimeLimitExceeded`` (a hard time
    limit), or a plain payload. Anything else is a ``tool_execution_failure`` saying
    what was found. A payload is returned as stored, not validated (batch reads
    decode thousands at a time).
    """
    if isinstance(value, SkillInvocationFailed):
        return value.payload
    if isinstance(value, BaseException):
        args: tuple[Any, ...] = tuple(getattr(value, "args", ()))
        if len(args) == 2 and isinstance(args[1], dict):
            return args[1]  # SkillInvocationFailed rebuilt by Celery under another class
        if type(value).__name__ == _TIME_LIMIT:
            return _hard_time_limit(request_id, args)
        return _unreadable(request_id, f"the task failed outside the runtime: {value!r}")
    if isinstance(value, dict) and "exc_type" in value:
        message = value.get("exc_message")
        if isinstance(message, list | tuple) and len(message) == 2 and isinstance(message[1], dict):
            return message[1]
        if value.get("exc_type") == _TIME_LIMIT:
            return _hard_time_limit(request_id, message)
        return _unreadable(request_id, f"the task failed outside the runtime: {value}")
    if not isinstance(value, dict):
        return _unreadable(
            request_id, f"stored result is not a SkillResult: {type(value).__name__}"
        )
    return value


def result_from_stored(value: Any, request_id: str = "") -> SkillResult:
    """Rebuild a ``SkillResult`` from what Celery stored (a payload, or the failure)."""
    return SkillResult.model_validate(stored_payload(value, request_id))
