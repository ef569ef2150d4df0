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

from cleveragents.error_types import SkillErrorType
from cleveragents.skills import SkillError, SkillResult
from cleveragents.wire import SkillInvocationFailed, failure_summary, result_payload

__all__ = ["SkillConsumer"]

log = logging.getLogger("cleveragents.worker")


def _task_id(message: Any) -> str | None:
    headers = getattr(message, "headers", None) or {}
    value = headers.get("id")
    return value if isinstance(value, str) and value else None


class SkillConsumer(Consumer):  # type: ignore[misc]
    """A consumer that answers a bad message with a ``validation_error`` result."""

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
        result = SkillResult(
            skill_name="",
            tool_name="",
            success=False,
            error=SkillError(
                error_type=SkillErrorType.VALIDATION_ERROR,
                message=f"invalid message: {why}",
                details={"content_type": getattr(message, "content_type", None)},
                skill_name="",
            ),
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
