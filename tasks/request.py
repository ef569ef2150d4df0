"""The worker-side request of ``skills.invoke``: its arguments are redacted in events.

Flower and ``celery events`` show a task's ``argsrepr``. A producer that is not
our client may send none (Celery then shows the arguments verbatim), so the
worker recomputes it from the body: skill, tool and flags stay visible, the
arguments' values never leave the worker, neither in events nor in the answers
to remote control's ``inspect`` (``info``).
"""

from __future__ import annotations

from typing import Any

from celery.worker.request import Request

from cleveragents.constants import REDACTED
from cleveragents.wire import redacted_repr
from worker.admission import NO_LINKS as _NO_LINKS

__all__ = ["RedactingRequest"]


class RedactingRequest(Request):  # type: ignore[misc]
    """A ``Request`` whose ``argsrepr``/``kwargsrepr`` never hold argument values."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        body_args, body_kwargs = self._args, self._kwargs  # type: ignore[attr-defined]
        if (
            isinstance(body_args, list | tuple)
            and len(body_args) == 1
            and isinstance(body_args[0], dict)
        ):
            self._argsrepr = redacted_repr(body_args[0])
        else:
            self._argsrepr = REDACTED if body_args else "()"
        self._kwargsrepr = REDACTED if body_kwargs else "{}"
        # The pool process gets the body the consumer admitted and cleaned (no linked
        # tasks: worker/admission.py), already decoded, instead of the raw bytes it
        # would decode (and verify) again with the producer's callbacks still in them.
        self._body = (body_args, body_kwargs, dict(_NO_LINKS))
        self._content_type = self._content_encoding = None
        self._decoded = True

    def info(self, safe: bool = False) -> Any:
        """What remote control (``inspect active/reserved/scheduled/query_task``) shows.

        Always the redacted form, whatever the caller asks: Flower's worker pages and
        ``celery inspect`` see what task events show, never the argument values.
        """
        return super().info(safe=True)
