"""Many results at once: read and write stored ``SkillResult``s in one round trip.

The store speaks the Celery result backend's own key and meta format, so a
result written here (by the batch path) reads like any task result: through
``AsyncResult``, ``SkillClient.get`` or ``cleveragents result ID``. With Redis,
reads are one ``MGET`` and writes one pipeline; other key-value backends (the
embedded file store) fall back to one call per key.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from cleveragents.retry import retrying
from cleveragents.runtime.gating import GATE_REQUEST
from cleveragents.skills import SkillResult
from cleveragents.wire import (
    WIRE_MODULE,
    SkillInvocationFailed,
    failure_summary,
    result_from_stored,
    result_payload,
)

__all__ = ["ResultStore", "refused_for_writes", "stored_meta"]

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
    value = meta.get("result")
    if meta["status"] == "FAILURE" and isinstance(value, dict):
        message = value.get("exc_message")
        if isinstance(message, list) and len(message) == 2 and isinstance(message[1], dict):
            return message[1]
        request_id = str(meta.get("task_id") or "")
        return result_payload(result_from_stored(value, request_id), request_id)
    return value if isinstance(value, dict) else None


def refused_for_writes(payload: dict[str, Any]) -> bool:
    """True when the result is a refusal by the request's own write gate, and only that."""
    error = payload.get("error")
    if not isinstance(error, dict) or error.get("error_type") != "permission_denied":
        return False
    details = error.get("details")
    return isinstance(details, dict) and details.get("gates") == [GATE_REQUEST]


class ResultStore:
    """Bulk access to the results in a Celery key-value result backend."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        client = getattr(backend, "client", None)  # the Redis backend's redis-py client
        self._redis = client if hasattr(client, "pipeline") else None

    def _key(self, request_id: str) -> Any:
        # The backend's own key type (bytes for the file store and Redis alike).
        return self.backend.get_key_for_task(request_id)

    def get_payloads(self, request_ids: Sequence[str]) -> list[dict[str, Any] | None]:
        """The stored payload of each id (None where there is none yet), in order."""
        if not request_ids:
            return []
        keys = [self._key(i) for i in request_ids]
        redis_client = self._redis
        if redis_client is not None:
            raw = retrying(lambda: redis_client.mget(keys))
        else:
            raw = list(self.backend.mget(keys))
        out: list[dict[str, Any] | None] = []
        for value in raw:
            if value is None:
                out.append(None)
                continue
            try:
                meta = json.loads(value)
            except ValueError:  # a file being written: not there yet
                out.append(None)
                continue
            out.append(payload_of(meta) if isinstance(meta, dict) else None)
        return out

    def existing(self, request_ids: Sequence[str]) -> set[str]:
        """The ids among ``request_ids`` that already have a finished result."""
        payloads = self.get_payloads(request_ids)
        return {rid for rid, p in zip(request_ids, payloads, strict=True) if p is not None}

    def reusable(
        self,
        request_ids: Sequence[str],
        allow_writes: Sequence[bool],
        *,
        forget_stale: bool = False,
    ) -> list[dict[str, Any] | None]:
        """The stored payload of each id where it answers that request, else None.

        A result refused only because the request did not allow writes does not
        answer the same request sent again with writes allowed (the run where the
        user forgot ``--allow-writes``): it runs again. With ``forget_stale`` such a
        result is deleted, so that nobody reads it while the new run is on its way.
        """
        payloads = self.get_payloads(request_ids)
        out: list[dict[str, Any] | None] = []
        stale: list[str] = []
        for rid, payload, writes in zip(request_ids, payloads, allow_writes, strict=True):
            if payload is not None and writes and refused_for_writes(payload):
                stale.append(rid)
                payload = None
            out.append(payload)
        if forget_stale and stale:
            self.forget(stale)
        return out

    def forget(self, request_ids: Sequence[str]) -> None:
        """Delete the stored results of ``request_ids``."""
        keys = [self._key(rid) for rid in request_ids]
        if self._redis is not None:
            redis_client = self._redis
            retrying(lambda: redis_client.delete(*keys))
            return
        for key in keys:
            self.backend.delete(key)

    def put_many(self, items: Iterable[tuple[str, SkillResult]]) -> None:
        """Store finished results, each under its own request id, in one round trip."""
        self._write([(self._key(rid), stored_meta(result, rid)) for rid, result in items])

    def put_payloads(self, items: Iterable[tuple[str, dict[str, Any]]]) -> None:
        """Store already-encoded result payloads (fields plus ``request_id``)."""
        self._write(
            [
                (self._key(rid), stored_meta(SkillResult.model_validate(payload), rid))
                for rid, payload in items
            ]
        )

    def _write(self, metas: list[tuple[Any, dict[str, Any]]]) -> None:
        if not metas:
            return
        if self._redis is not None:
            # No PUBLISH per result (Celery's own store does one): it would double the
            # commands of a batch, and SkillClient.wait also re-reads the store.
            expires = int(self.backend.expires or 0) or None
            encoded = [(key, json.dumps(meta, separators=(",", ":"))) for key, meta in metas]
            redis_client = self._redis

            def write() -> None:
                with redis_client.pipeline(transaction=False) as pipe:
                    for key, value in encoded:
                        pipe.set(key, value, ex=expires)
                    pipe.execute()

            retrying(write)
            return
        for key, meta in metas:
            self.backend.set(key, json.dumps(meta))
