"""Stored results in the Celery result backend's own meta format, shared by every result store.

A result written by a store reads like any task result: through ``AsyncResult``,
``SkillClient.get`` or ``cleveragents result ID``. The implementations differ only
in how they read, write and delete many keys at once.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from cleveragents.messages import (
    WIRE_MODULE,
    SkillInvocationFailed,
    failure_summary,
    result_payload,
    stored_payload,
)
from cleveragents.runtime.gating import GATE_REQUEST
from cleveragents.skills import SkillResult

__all__ = ["KeyValueResults", "payload_of", "refused_for_writes", "stored_meta"]

_READY = ("SUCCESS", "FAILURE")


def stored_meta(result: SkillResult, request_id: str) -> dict[str, Any]:
    """The Celery meta of a finished invocation: SUCCESS with the payload, or FAILURE."""
    payload = result_payload(result, request_id)
    if result.success:
        status, value = "SUCCESS", payload
    else:
        status = "FAILURE"
        value = {
            "exc_type": SkillInvocationFailed.__name__,
            "exc_message": [failure_summary(result), payload],
            "exc_module": WIRE_MODULE,
        }
    return {
        "status": status,
        "result": value,
        "traceback": None,
        "children": [],
        "date_done": datetime.now(UTC).isoformat(),
        "task_id": request_id,
    }


def payload_of(meta: dict[str, Any]) -> dict[str, Any] | None:
    """The stored ``SkillResult`` payload (fields plus ``request_id``) of a meta, if finished."""
    if meta.get("status") not in _READY:
        return None
    return stored_payload(meta.get("result"), str(meta.get("task_id") or ""))


def refused_for_writes(payload: dict[str, Any]) -> bool:
    """True when the result is a refusal by the request's own write gate, and only that.

    Such a result never answers the same request sent with writes allowed: it is
    the run where the user forgot ``--allow-writes``, and a reader waiting for the
    re-run reads past it until the worker replaces it (a producer deletes nothing).
    """
    error = payload.get("error")
    if not isinstance(error, dict) or error.get("error_type") != "permission_denied":
        return False
    details = error.get("details")
    return isinstance(details, dict) and details.get("gates") == [GATE_REQUEST]


def _decode(raw: Any) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        meta = json.loads(raw)
    except ValueError:  # a file being written: not there yet
        return None
    return payload_of(meta) if isinstance(meta, dict) else None


class KeyValueResults(ABC):
    """A ``ResultStore`` over three primitives: read, write and delete many keys."""

    @abstractmethod
    def _read(self, request_ids: Sequence[str]) -> Sequence[Any]:
        """The stored JSON text (str or bytes) of each id, None where there is none."""

    @abstractmethod
    def _write(self, metas: Sequence[tuple[str, dict[str, Any]]]) -> None:
        """Store each meta under its request id (never called with nothing to write)."""

    @abstractmethod
    def _delete(self, request_ids: Sequence[str]) -> None:
        """Delete the stored results of ``request_ids`` (never called with none)."""

    def get_payloads(self, request_ids: Sequence[str]) -> list[dict[str, Any] | None]:
        """The stored payload of each id (None where there is none yet), in order."""
        if not request_ids:
            return []
        return [_decode(raw) for raw in self._read(request_ids)]

    def reusable(
        self, request_ids: Sequence[str], allow_writes: Sequence[bool]
    ) -> list[dict[str, Any] | None]:
        """The stored payload of each id where it answers that request, else None.

        A result refused only because the request did not allow writes does not
        answer the same request sent again with writes allowed (the run where the
        user forgot ``--allow-writes``): it runs again, and its worker replaces it.
        """
        payloads = self.get_payloads(request_ids)
        return [
            None if payload is not None and writes and refused_for_writes(payload) else payload
            for payload, writes in zip(payloads, allow_writes, strict=True)
        ]

    def forget(self, request_ids: Sequence[str]) -> None:
        """Delete the stored results of ``request_ids``."""
        if request_ids:
            self._delete(request_ids)

    def put_many(self, items: Iterable[tuple[str, SkillResult]]) -> None:
        """Store finished results, each under its own request id, in one round trip."""
        metas = [(rid, stored_meta(result, rid)) for rid, result in items]
        if metas:
            self._write(metas)
