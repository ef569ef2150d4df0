"""The worker-side request of our tasks: their arguments are redacted in events.

Flower and ``celery events`` show a task's ``argsrepr``. A producer that is not
our client may send none (Celery then shows the arguments verbatim), or any text,
so the worker recomputes it from the body: skill and tool first, then argument
names and flags (``redacted_repr``); for a chunk its skills and tools, batch id
and item numbers (``chunk_repr``). The arguments' values never leave the worker,
neither in events nor in the answers to remote control's ``inspect`` (``info``).

The request also records, for the pool process, whether the worker sends task
events (``cleveragents.tasks.events``: a chunk's failed invocations are rows of their own then).
"""

from __future__ import annotations

from typing import Any

from celery.worker.request import Request

from cleveragents.constants import BATCH_HEADER, REDACTED, TASK_INVOKE_CHUNK
from cleveragents.messages import ChunkContext, SkillInvocationFailed, chunk_repr, redacted_repr
from cleveragents.tasks.events import EVENTS_FIELD, task_events_on
from cleveragents.worker.admission import NO_LINKS as _NO_LINKS

__all__ = ["RedactingRequest"]


class RedactingRequest(Request):  # type: ignore[misc]
    """A ``Request`` whose ``argsrepr``/``kwargsrepr`` never hold argument values."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        body_args, body_kwargs = self._args, self._kwargs  # type: ignore[attr-defined]
        one = body_args[0] if isinstance(body_args, list | tuple) and len(body_args) == 1 else None
        if self._type == TASK_INVOKE_CHUNK and isinstance(one, list):  # type: ignore[attr-defined]
            header = self._request_dict.get(BATCH_HEADER)  # type: ignore[attr-defined]
            self._argsrepr = chunk_repr(one, ChunkContext.from_header(header, len(one)))
        elif isinstance(one, dict):
            self._argsrepr = redacted_repr(one)
        else:
            self._argsrepr = REDACTED if body_args else "()"
        self._kwargsrepr = REDACTED if body_kwargs else "{}"
        # Read by the pool process (task.request): set here, whatever a producer sent.
        events = task_events_on(self._eventer) and self.task.send_events  # type: ignore[attr-defined]
        self._request_dict[EVENTS_FIELD] = bool(events)  # type: ignore[attr-defined]
        # The pool process gets the body the consumer admitted and cleaned (no linked
        # tasks: cleveragents/worker/admission.py), already decoded, instead of the raw bytes it
        # would decode (and verify) again with the producer's callbacks still in them.
        self._body = (body_args, body_kwargs, dict(_NO_LINKS))
        self._content_type = self._content_encoding = None
        self._decoded = True

    def send_event(self, type: str, **fields: Any) -> None:
        """Celery's, without the traceback of a failed invocation: a ``SkillResult``
        failure is the tool's or the request's, told in full by its error type and
        message (the ``exception`` field); the traceback would be of the task body
        that reported it, which Flower's task page showed as if the worker had crashed."""
        if type == "task-failed" and str(fields.get("exception", "")).startswith(
            f"{SkillInvocationFailed.__name__}("
        ):
            fields["traceback"] = None
        super().send_event(type, **fields)

    def info(self, safe: bool = False) -> Any:
        """What remote control (``inspect active/reserved/scheduled/query_task``) shows.

        Always the redacted form, whatever the caller asks: Flower's worker pages and
        ``celery inspect`` see what task events show, never the argument values.
        """
        return super().info(safe=True)
