"""In-memory stores: complete doubles of the Redis and file ones, for tests and in-process use.

Like dramatiq's ``StubBackend``: the policy that uses a store (the guard, the
pipeline, batches, metrics) can be exercised without a server. State lives in
the object and is shared by threads, not processes.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from cleveragents.constants import DEAD_LETTER_LIMIT
from cleveragents.stores.base import (
    Binding,
    Claim,
    MetricCounts,
    StartedMark,
    bind_then_start,
)
from cleveragents.stores.result_meta import KeyValueResults

__all__ = ["MemoryBatchLedger", "MemoryGuardStore", "MemoryMetricStore", "MemoryResultStore"]


class MemoryGuardStore:
    """Guard records in dictionaries, behind one lock."""

    def __init__(self, *, marks_redeliveries: bool = True) -> None:
        #: Which broker to stand in for: True like Redis, False like the embedded default.
        self.marks_redeliveries = marks_redeliveries
        self._lock = threading.Lock()
        self._attempts: dict[str, int] = {}
        self._claims: dict[str, Claim] = {}
        #: The dead letters kept, newest first, as JSON text: what a test reads back.
        self.dead: list[str] = []
        self._bound: dict[str, str] = {}

    def attempt(self, request_id: str) -> int:
        """Count one more delivery of ``request_id``; return how many have been counted."""
        with self._lock:
            self._attempts[request_id] = self._attempts.get(request_id, 0) + 1
            return self._attempts[request_id]

    def claim(self, request_id: str, claim: Claim) -> Claim | None:
        """Take the write claim atomically: None when taken, else the claim already held."""
        with self._lock:
            held = self._claims.get(request_id)
            if held is not None:
                return None if held.same_as(claim) else held
            self._claims[request_id] = claim
            return None

    def read_claim(self, request_id: str) -> Claim | None:
        """The write claim of ``request_id``, if any."""
        with self._lock:
            return self._claims.get(request_id)

    def finish(self, request_id: str, payload: dict[str, Any]) -> None:
        """Record the result of a claimed write in its claim."""
        with self._lock:
            self._claims[request_id] = Claim.finished(json.loads(json.dumps(payload)))

    def dead_letter(self, request_id: str, record: dict[str, Any]) -> None:
        """Keep a poison invocation for inspection (newest first, the last 10,000)."""
        text = json.dumps({"request_id": request_id, **record})
        with self._lock:
            self.dead = [text, *self.dead][:DEAD_LETTER_LIMIT]

    def bind(self, pairs: Sequence[tuple[str, str]]) -> list[str | None]:
        """Bind ids to digests, behind the lock."""
        with self._lock:
            before = [self._bound.get(request_id) for request_id, _ in pairs]
            for request_id, digest in pairs:
                self._bound.setdefault(request_id, digest)
            return before

    def binding(self, request_id: str) -> str | None:
        """The digest the id is bound to, if any."""
        with self._lock:
            return self._bound.get(request_id)

    def bind_starting(self, request_id: str, digest: str, mark: StartedMark) -> Binding:
        """Bind the id, then store ``mark`` through the backend if it was free."""
        return bind_then_start(self, request_id, digest, mark)

    def cancel(self, request_id: str) -> bool:
        """Nothing: its workers cannot be told (docs/mcp.md, "Cancellation")."""
        return False


class MemoryResultStore(KeyValueResults):
    """Results as JSON text in a dictionary, in Celery's meta format like the others."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, str] = {}

    def _read(self, request_ids: Sequence[str]) -> Sequence[Any]:
        with self._lock:
            return [self._values.get(rid) for rid in request_ids]

    def _write(self, metas: Sequence[tuple[str, dict[str, Any]]]) -> None:
        encoded = {rid: json.dumps(meta) for rid, meta in metas}
        with self._lock:
            self._values.update(encoded)

    def _delete(self, request_ids: Sequence[str]) -> None:
        with self._lock:
            for rid in request_ids:
                self._values.pop(rid, None)


class MemoryBatchLedger:
    """Batches in dictionaries."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._metas: dict[str, str] = {}
        self._ids: dict[str, list[str]] = {}
        self._refused: dict[str, dict[str, str]] = {}
        self._seals: dict[str, str] = {}

    def set_meta(self, batch_id: str, meta: dict[str, Any]) -> None:
        """Record (or replace) what the batch is: its file, counts, times."""
        with self._lock:
            self._metas[batch_id] = json.dumps(meta)

    def meta(self, batch_id: str) -> dict[str, Any] | None:
        """The batch's description, or None when there is no such batch."""
        with self._lock:
            raw = self._metas.get(batch_id)
        return json.loads(raw) if raw else None

    def append(self, batch_id: str, request_ids: Sequence[str]) -> None:
        """Add request ids behind those already recorded."""
        with self._lock:
            self._ids.setdefault(batch_id, []).extend(request_ids)

    def ids(self, batch_id: str) -> Iterator[str]:
        """The batch's request ids, in input order (as recorded when iteration starts)."""
        with self._lock:
            ids = list(self._ids.get(batch_id, ()))
        yield from ids

    def length(self, batch_id: str) -> int:
        """How many request ids the batch's ledger holds."""
        with self._lock:
            return len(self._ids.get(batch_id, ()))

    def seal(self, batch_id: str, seal: str) -> str | None:
        """Make the batch's seal once: None when made, else the one already there."""
        with self._lock:
            before = self._seals.setdefault(batch_id, seal)
        return None if before == seal else before

    def seal_of(self, batch_id: str) -> str | None:
        """The batch's seal, if it has one."""
        with self._lock:
            return self._seals.get(batch_id)

    def refuse(self, batch_id: str, payloads: Sequence[tuple[str, dict[str, Any]]]) -> None:
        """Keep the results of lines answered without being sent."""
        with self._lock:
            kept = self._refused.setdefault(batch_id, {})
            kept.update((rid, json.dumps(payload)) for rid, payload in payloads)

    def refusals(self, batch_id: str, request_ids: Sequence[str]) -> list[dict[str, Any] | None]:
        """The kept result of each id, None where its line was sent."""
        with self._lock:
            kept = self._refused.get(batch_id, {})
            raw = [kept.get(rid) for rid in request_ids]
        return [None if text is None else json.loads(text) for text in raw]


class MemoryMetricStore:
    """Counters kept in the object (unlike the embedded default's, which drops them)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals = MetricCounts()

    def add(self, counts: MetricCounts) -> None:
        """Add ``counts`` to the totals."""
        with self._lock:
            self._totals.add(counts)

    def totals(self) -> MetricCounts:
        """A copy of every count added so far."""
        with self._lock:
            copy = MetricCounts()
            copy.add(self._totals)
            return copy
