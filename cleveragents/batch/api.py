"""Batch operations on a ``SkillClient``: run many, submit in the background, status, results."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from cleveragents.batch.gather import Entry, OrderedGather
from cleveragents.batch.runner import BatchRunner, invalid_payload, reused_payload
from cleveragents.batch.seal import (
    BatchIdTaken,
    LedgerChanged,
    Seal,
    SealedIds,
    problem,
    sealed,
    wrong_length,
)
from cleveragents.batch.source import BatchItem
from cleveragents.errors import SchemaValidationError
from cleveragents.messages import ChunkContext
from cleveragents.runtime.invoke import parse_request
from cleveragents.runtime.request import SkillInvocationRequest
from cleveragents.skills import SkillResult
from cleveragents.stores import BatchLedger, ResultStore

__all__ = [
    "BatchProducer",
    "BatchStatus",
    "as_items",
    "batch_results",
    "batch_status",
    "run_many",
    "submit_batch",
]

#: Chunk size of background batches (no results come back to adapt it).
SUBMIT_CHUNK = 100


class BatchProducer(Protocol):
    """What batches need of a producer (a ``SkillClient``): its stores and a chunk sender."""

    @property
    def results(self) -> ResultStore:
        """Where results are stored."""
        ...

    @property
    def ledger(self) -> BatchLedger:
        """Where background batches keep their ordered request ids."""
        ...

    def send_chunk(
        self, requests: list[SkillInvocationRequest], context: ChunkContext | None = None
    ) -> str | None:
        """Publish many requests as one chunk message (``context``: their place); return its id."""
        ...

    def bound_elsewhere(self, requests: Sequence[SkillInvocationRequest]) -> list[bool]:
        """Bind each request's id to its content; True where it was bound to other content."""
        ...


def as_items(requests: Iterable[SkillInvocationRequest | Mapping[str, Any]]) -> Iterator[BatchItem]:
    """Requests (models or dicts) as batch items; an invalid one becomes an item with a problem."""
    for number, raw in enumerate(requests, 1):
        if isinstance(raw, SkillInvocationRequest):
            yield BatchItem(number, raw.request_id, raw, None, raw.skill, raw.tool)
            continue
        try:
            request = parse_request(raw)
        except SchemaValidationError as exc:
            data = raw if isinstance(raw, Mapping) else {}
            rid, skill, tool = (data.get(k) for k in ("request_id", "skill", "tool"))
            yield BatchItem(
                number,
                rid if isinstance(rid, str) else f"invalid-{uuid.uuid4()}",
                None,
                f"request {number}: {exc}",
                skill if isinstance(skill, str) else "",
                tool if isinstance(tool, str) else "",
            )
            continue
        yield BatchItem(number, request.request_id, request, None, request.skill, request.tool)


def run_many(
    client: BatchProducer,
    items: Iterable[BatchItem],
    *,
    reuse: bool = True,
    chunk_size: int | None = None,
    window: int | None = None,
    batch_id: str | None = None,
    total: int | None = None,
) -> BatchRunner:
    """A runner that submits ``items`` in chunks and yields their entries in input order.

    Its chunks carry ``batch_id`` (default: a new one) and their item numbers, ``of
    total`` where given (else once the items are all read), for Flower to show.
    """
    options: dict[str, Any] = {
        "reuse": reuse,
        "chunk_size": chunk_size,
        "batch_id": batch_id,
        "total": total,
    }
    if window is not None:
        options["window"] = window
    return BatchRunner(
        items, client.results, client.send_chunk, bind=client.bound_elsewhere, **options
    )


class _Submission:
    """A background batch being submitted: chunks by queue, ids in order, invalid lines."""

    def __init__(self, client: BatchProducer, batch_id: str) -> None:
        self.client = client
        self.batch_id = batch_id
        self.total = 0
        self.chunks: dict[bool, list[SkillInvocationRequest]] = {False: [], True: []}
        self.positions: dict[bool, list[int]] = {False: [], True: []}  # item numbers, as chunks
        self.ids: list[str] = []
        self.recorded = SealedIds()
        self.invalid: list[tuple[str, dict[str, Any]]] = []
        self.waiting: list[BatchItem] = []

    def add(self, item: BatchItem) -> None:
        """Take one item; its ids are bound a group at a time, in one round trip."""
        self.waiting.append(item)
        if len(self.waiting) >= SUBMIT_CHUNK:
            self._admit()

    def _admit(self) -> None:
        items, self.waiting = self.waiting, []
        requests = [item.request for item in items if item.request is not None]
        reused = {
            id(request)
            for request, refused in zip(
                requests, self.client.bound_elsewhere(requests) if requests else [], strict=True
            )
            if refused
        }
        for item in items:
            if item.request is not None and id(item.request) in reused:
                # Its id answers another request: its line gets a refusal under an id
                # of its own, and the other request's result stays as it is.
                own = f"reused-{uuid.uuid4()}"
                self._take_invalid(own, {**reused_payload(item.request), "request_id": own})
            else:
                self._take(item)

    def _take_invalid(self, request_id: str, payload: dict[str, Any]) -> None:
        self.total += 1
        self.ids.append(request_id)
        self.invalid.append((request_id, payload))
        if len(self.invalid) >= SUBMIT_CHUNK:
            self._store_invalid()

    def _take(self, item: BatchItem) -> None:
        """Take one item; send its chunk once full (its ids recorded first)."""
        if item.request is None:
            self._take_invalid(item.request_id, invalid_payload(item))
            return
        self.total += 1
        self.ids.append(item.request_id)
        writes = item.request.allow_writes
        self.chunks[writes].append(item.request)
        self.positions[writes].append(self.total)
        if len(self.chunks[writes]) >= SUBMIT_CHUNK:
            self._record_ids()
            self._send(writes)

    def close(self) -> None:
        """Record the remaining ids, send the last chunks, store the last invalid lines."""
        self._admit()
        self._record_ids()
        self._send(False)
        self._send(True)
        self._store_invalid()

    def _record_ids(self) -> None:
        # Refusals first: a reader that finds an id in the ledger finds its refusal too.
        self._store_invalid()
        self.client.ledger.append(self.batch_id, self.ids)
        self.recorded.add(self.ids)
        self.ids = []

    def _send(self, writes: bool) -> None:
        if self.chunks[writes]:
            context = ChunkContext(self.batch_id, tuple(self.positions[writes]))
            self.client.send_chunk(self.chunks[writes], context)
            self.chunks[writes], self.positions[writes] = [], []

    def _store_invalid(self) -> None:
        # Kept in the batch's ledger, not stored as results: a producer's Redis user
        # may not write results (it could forge any invocation's).
        self.client.ledger.refuse(self.batch_id, self.invalid)
        self.invalid = []


def submit_batch(
    client: BatchProducer,
    items: Iterable[BatchItem],
    *,
    batch_id: str | None = None,
    source: str = "",
) -> tuple[str, int]:
    """Submit every item in chunks without waiting; returns the batch id and the count.

    Its ids are sealed once all are recorded (``cleveragents.batch.seal``).

    Raises:
        BatchIdTaken: ``batch_id`` names a sealed batch (nothing is sent), or another
            seal was made under it while this one was submitted.
    """
    batch_id = batch_id or uuid.uuid4().hex[:16]
    if client.ledger.seal_of(batch_id) is not None:
        raise BatchIdTaken(
            f"batch id {batch_id} is taken: a batch was submitted under it; nothing was "
            "sent (give another --batch-id, or none for a new one)"
        )
    meta: dict[str, Any] = {
        "batch_id": batch_id,
        "source": source,
        "total": None,
        "created": datetime.now(UTC).isoformat(),
    }
    client.ledger.set_meta(batch_id, meta)
    submission = _Submission(client, batch_id)
    for item in items:
        submission.add(item)
    submission.close()
    other = client.ledger.seal(batch_id, submission.recorded.seal().encode())
    client.ledger.set_meta(batch_id, {**meta, "total": submission.total})
    if other is not None:
        raise BatchIdTaken(
            f"batch id {batch_id} is taken: another seal was made under it while its "
            f"{submission.total} requests were sent; `batch status` will report its ledger "
            "as changed"
        )
    return batch_id, submission.total


@dataclass
class BatchStatus:
    """How far a background batch has come."""

    batch_id: str
    source: str
    total: int
    done: int = 0
    succeeded: int = 0
    failed_by_type: dict[str, int] = field(default_factory=dict)
    #: What is wrong with a sealed batch's ledger (None: nothing): it holds other ids
    #: than those sealed at submit; then nothing is counted.
    tampered: str | None = None

    @property
    def failed(self) -> int:
        """How many finished invocations failed."""
        return sum(self.failed_by_type.values())


def _count(status: BatchStatus, payload: Mapping[str, Any]) -> None:
    status.done += 1
    if payload.get("success"):
        status.succeeded += 1
        return
    error = payload.get("error") or {}
    kind = str(error.get("error_type", "unknown")) if isinstance(error, dict) else "unknown"
    status.failed_by_type[kind] = status.failed_by_type.get(kind, 0) + 1


def batch_status(client: BatchProducer, batch_id: str) -> BatchStatus | None:
    """Counts of a background batch (None when there is no such batch)."""
    meta = client.ledger.meta(batch_id)
    if meta is None:
        return None
    status = BatchStatus(batch_id, str(meta.get("source", "")), int(meta.get("total") or 0))
    seal = _seal(client, batch_id)
    if seal is not None:
        status.total = seal.count
        status.tampered = wrong_length(client.ledger.length(batch_id), seal)
        if status.tampered is not None:
            return status
    read = SealedIds()  # the ids are checked against the seal as they are counted
    page: list[str] = []
    for rid in sealed(client.ledger.ids(batch_id), seal):
        page.append(rid)
        if len(page) >= 2000:
            read.add(page)
            _count_page(status, client, batch_id, page)
            page = []
    read.add(page)
    _count_page(status, client, batch_id, page)
    if seal is not None and read.seal() != seal:  # which ids are the batch's own is unknown
        return BatchStatus(
            batch_id, status.source, seal.count, tampered="its ids differ from those sealed"
        )
    return status


def _seal(client: BatchProducer, batch_id: str) -> Seal | None:
    raw = client.ledger.seal_of(batch_id)
    return None if raw is None else Seal.decode(raw)


def _problem(client: BatchProducer, batch_id: str, seal: Seal | None) -> str | None:
    if seal is None:
        return None
    return problem(client.ledger.ids(batch_id), client.ledger.length(batch_id), seal)


def _count_page(
    status: BatchStatus, client: BatchProducer, batch_id: str, page: Sequence[str]
) -> None:
    payloads = client.results.get_payloads(page)
    unsent = [i for i, payload in enumerate(payloads) if payload is None]
    kept = _kept_failures(client, batch_id, [page[i] for i in unsent])
    for i, failure in zip(unsent, kept, strict=True):
        payloads[i] = failure
    for payload in payloads:
        if payload is not None:
            _count(status, payload)


def _kept_failures(client: BatchProducer, batch_id: str, ids: Sequence[str]) -> list[Any]:
    """The ledger's kept results of ``ids`` that are failures (a refusal never succeeds)."""
    kept = client.ledger.refusals(batch_id, ids) if ids else []
    return [k if isinstance(k, dict) and k.get("success") is False else None for k in kept]


def _refusals(client: BatchProducer, batch_id: str, ids: Sequence[str]) -> list[Any]:
    """The ledger's kept results of ``ids`` that no stored result overrides.

    The ledger is the producers' own: a kept result counts only as a failure (a
    refusal never succeeds), and only where the result store holds nothing for its
    id, so that a ledger entry can never stand for a result a worker stored. (An
    older producer stored its refusals as results, which the store still answers.)
    """
    failures = _kept_failures(client, batch_id, ids)
    found = [i for i, k in enumerate(failures) if k is not None]
    if found:
        stored = client.results.get_payloads([ids[i] for i in found])
        for i, payload in zip(found, stored, strict=True):
            if payload is not None:
                failures[i] = None
    return failures


def batch_results(client: BatchProducer, batch_id: str, *, poll_s: float = 0.05) -> Iterator[Entry]:
    """Every result of a background batch, in input order, waiting for those not yet done.

    Raises:
        LedgerChanged: before any result, when the batch's ledger holds other ids than
            those sealed at submit.
    """
    seal = _seal(client, batch_id)
    wrong = _problem(client, batch_id, seal)
    if wrong is not None:
        raise LedgerChanged(wrong)
    gather = OrderedGather(client.results)
    ids = sealed(client.ledger.ids(batch_id), seal)
    exhausted = False
    while True:
        page: list[str] = []
        while not exhausted and len(gather) + len(page) < 20_000:
            rid = next(ids, None)
            if rid is None:
                exhausted = True
                break
            page.append(rid)
        # A line answered without being sent has its result in the ledger, kept before
        # its id was recorded: looked up once, as its id joins the window (a stored
        # result for its id, whoever sent it, is read instead, as for any other).
        for rid, kept in zip(page, _refusals(client, batch_id, page), strict=True):
            gather.add(Entry(0, rid, payload=kept))
        ready = gather.poll()
        yield from ready
        if exhausted and not gather.pending:
            return
        if not ready:
            time.sleep(poll_s)


def results_in_order(runner: Iterable[Entry]) -> Iterator[SkillResult]:
    """``SkillResult``s of a run, in input order."""
    for entry in runner:
        yield SkillResult.model_validate(entry.payload or {})
