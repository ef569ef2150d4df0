"""The worker's message consumer: undecodable or disallowed messages still get a result.

Celery acks (or rejects) such a message and logs its body. Here the body is
never logged (it can hold secrets), and when the message's headers carry a
task id, a ``validation_error`` ``SkillResult`` is stored under it, so the
producer waiting on that id learns what happened instead of waiting for ever.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.worker.consumer import Consumer

from cleveragents.constants import MAX_MESSAGE_BYTES
from cleveragents.error_types import SkillErrorType
from cleveragents.outcomes import failed_result
from cleveragents.wire import SkillInvocationFailed, failure_summary, result_payload

__all__ = ["SkillConsumer"]

log = logging.getLogger("cleveragents.worker")

#: The only content type a worker decodes.
ACCEPTED_CONTENT_TYPE = "application/json"


def _task_id(message: Any) -> str | None:
    headers = getattr(message, "headers", None) or {}
    value = headers.get("id")
    return value if isinstance(value, str) and value else None


def _envelope_problem(message: Any) -> str | None:
    """Why the message is not a Celery protocol-2 task message, or None when it is one.

    Celery unpacks the body as ``(args, kwargs, embed)`` without checking it, and a
    body of another shape (a JSON string of three characters, say) fails later, in
    the pool's callbacks, leaving no result.
    """
    headers = getattr(message, "headers", None)
    if not isinstance(headers, dict) or not isinstance(headers.get("task"), str):
        return "the headers name no task"
    if not isinstance(headers.get("id"), str):
        return "the headers carry no task id"
    body = message.payload  # decoded once; kombu caches it for Celery
    if not (isinstance(body, list | tuple) and len(body) == 3):
        return "the body is not [args, kwargs, options]"
    args, kwargs, embed = body
    if not isinstance(args, list | tuple) or not isinstance(kwargs, dict):
        return "the body's args or kwargs have the wrong type"
    if embed is not None and not isinstance(embed, dict):
        return "the body's options are not an object"
    return None


class SkillConsumer(Consumer):  # type: ignore[misc]
    """A consumer that answers a bad message with a ``validation_error`` result."""

    def create_task_handler(self, *args: Any, **kwargs: Any) -> Any:
        """Celery's handler, behind checks that refuse bad messages undecoded.

        Too large, or not JSON: answered with a ``validation_error`` and acked.
        kombu passes "raw" content types (``text/plain``, ...) through undecoded and
        Celery then fails on them outside its own error handling, stopping the
        consumer; any other error of a malformed envelope is contained the same way.
        """
        handler = super().create_task_handler(*args, **kwargs)

        def refuse(message: Any, why: str) -> None:
            self._answer(message, why)
            message.ack()

        def on_task_received(message: Any) -> Any:
            body = getattr(message, "body", None)
            size = len(body) if isinstance(body, bytes | str) else 0
            if size > MAX_MESSAGE_BYTES:
                return refuse(
                    message,
                    f"the message is {size} bytes, more than the limit of {MAX_MESSAGE_BYTES}",
                )
            content_type = getattr(message, "content_type", None)
            if content_type != ACCEPTED_CONTENT_TYPE:
                return refuse(message, f"content type {content_type!r} is not accepted (JSON only)")
            try:
                problem = _envelope_problem(message)
                if problem is not None:
                    return refuse(message, problem)
                return handler(message)
            except self.connection_errors:  # type: ignore[attr-defined]
                raise
            except Exception as exc:
                return refuse(message, f"malformed message ({type(exc).__name__})")

        return on_task_received

    def _answer(self, message: Any, why: str) -> None:
        task_id = _task_id(message)
        log.error(
            "rejected message %s (content type %r): %s",
            task_id or "<no id>",
            getattr(message, "content_type", None),
            why,
        )
        if task_id is None:
            return
        result = failed_result(
            "",
            "",
            SkillErrorType.VALIDATION_ERROR,
            f"invalid message: {why}",
            {"content_type": getattr(message, "content_type", None)},
        )
        failure = SkillInvocationFailed(failure_summary(result), result_payload(result, task_id))
        try:
            self.app.backend.mark_as_failure(task_id, failure, store_result=True)
        except Exception as exc:  # the message is dropped either way; say why it has no result
            log.error("could not store the result of rejected message %s: %s", task_id, exc)

    def on_decode_error(self, message: Any, exc: Exception) -> None:
        """A body that does not decode (not JSON): answer it, ack it, never log the body."""
        self._answer(message, f"the body cannot be decoded ({type(exc).__name__})")
        message.ack()

    def on_invalid_task(self, body: Any, message: Any, exc: Exception) -> None:
        """A disallowed content type (pickle, ...) or a malformed envelope: answer, reject."""
        self._answer(
            message, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        )
        message.reject_log_error(log, self.connection_errors)  # type: ignore[attr-defined]
