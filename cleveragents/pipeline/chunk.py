"""``execute_chunk``: many invocations of one message, a time slice at a time.

Each request still gets its own gating, validation and timeout (the runtime), and
its own ``SkillResult`` under its own request id. A request whose result is
already stored (a redelivered chunk, a resumed batch) is not run again, nor is an
id seen twice in one chunk. After ``SLICE_S`` the requests not yet run are handed
to ``requeue``, so that the process turns to other queues in between: an
interactive invocation never waits behind a whole chunk.

The invocations that failed are handed to ``report_failures`` once their results
are stored (a worker shows each in Flower as its own failed row); successes are
only counted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from cleveragents.binding import content_digest, reused_result
from cleveragents.outcomes import text_field
from cleveragents.pipeline.invocation import Pipeline
from cleveragents.skills import SkillResult

__all__ = [
    "CHECK_EVERY_N",
    "FLUSH_EVERY_N",
    "SLICE_S",
    "ChunkReport",
    "ItemFailure",
    "ReportFailures",
    "Requeue",
    "execute_chunk",
]

#: A chunk runs for at most about this long before the rest of it is requeued.
SLICE_S = 0.02
#: Results are written at least every this many invocations.
FLUSH_EVERY_N = 250
#: Requests whose stored results are looked up at once (the slice may end before the rest).
CHECK_EVERY_N = 32

#: Sends the requests of a chunk not yet run back to the end of its queue.
Requeue = Callable[[list[Any]], None]


@dataclass(frozen=True)
class ItemFailure:
    """One invocation of a chunk that failed: what a monitor needs to show it on its own."""

    #: Its place among the chunk's requests (0-based).
    index: int
    request_id: str
    #: The request as delivered.
    body: Any
    result: SkillResult
    #: When it started (epoch seconds) and how long it ran.
    started: float
    runtime_s: float


#: Told of failed invocations once their results are stored, a group at a time.
ReportFailures = Callable[[list[ItemFailure]], None]


@dataclass(frozen=True)
class ChunkReport:
    """What one slice of a chunk did."""

    invocations: int
    ran: int
    skipped: int

    def as_dict(self) -> dict[str, int]:
        """The report as the task's return value."""
        return asdict(self)


class _Slice:
    """The state of one slice: results not yet stored, ids seen, counts."""

    def __init__(
        self, pipeline: Pipeline, careful: bool, report: ReportFailures | None = None
    ) -> None:
        self.pipeline = pipeline
        self.report = report
        self.failures: list[ItemFailure] = []
        # A chunk that came back may hold the invocation that kills its process:
        # each of its invocations counts its own deliveries and is stored at once,
        # so that only that one is ever run again.
        self.careful = careful
        self.pending: list[tuple[str, SkillResult]] = []
        self.seen: set[str] = set()
        self.ran = self.skipped = 0

    def run_group(self, bodies: Sequence[Any], offset: int) -> None:
        """Run the requests of ``bodies`` (from ``offset`` in the chunk) not yet stored."""
        ids = [text_field(body, "request_id") for body in bodies]
        done = self._finished(bodies, ids) | self._bound_elsewhere(bodies, ids)
        for index, (body, rid) in enumerate(zip(bodies, ids, strict=True), offset):
            if not rid or rid in done or rid in self.seen:
                self.skipped += 1  # no id to store a result under, or already finished
                continue
            self.seen.add(rid)  # the same id twice in one chunk runs once
            started, clock = time.time(), time.monotonic()
            result = self.pipeline.run_guarded(body, rid, redelivered=self.careful, chunk_item=True)
            self.pipeline.observe(rid, result)
            if not result.success and self.report is not None:
                runtime = time.monotonic() - clock
                self.failures.append(ItemFailure(index, rid, body, result, started, runtime))
            self.pending.append((rid, result))
            self.ran += 1
            if self.careful:
                self.flush()
        if len(self.pending) >= FLUSH_EVERY_N:
            self.flush()

    def _bound_elsewhere(self, bodies: Sequence[Any], ids: list[str]) -> set[str]:
        """Ids bound to other content: run nothing, store nothing (``cleveragents.binding``)."""
        known = [
            (rid, body, content_digest(body)) for rid, body in zip(ids, bodies, strict=True) if rid
        ]
        before = self.pipeline.guard.store.bind([(rid, digest) for rid, _, digest in known])
        reused = set()
        for (rid, body, digest), bound in zip(known, before, strict=True):
            if bound is not None and bound != digest:
                reused.add(rid)
                self.pipeline.observe(rid, reused_result(body))
        return reused

    def _finished(self, bodies: Sequence[Any], ids: list[str]) -> set[str]:
        known = [(rid, body) for rid, body in zip(ids, bodies, strict=True) if rid]
        payloads = self.pipeline.results.reusable(
            [rid for rid, _ in known],
            [isinstance(body, dict) and body.get("allow_writes") is True for _, body in known],
        )
        return {rid for (rid, _), p in zip(known, payloads, strict=True) if p is not None}

    def flush(self) -> None:
        """Store the results not yet stored, then report the failures among them."""
        if self.pending:
            self.pipeline.results.put_many(self.pending)
            self.pending = []
        if self.failures and self.report is not None:
            failures, self.failures = self.failures, []
            self.report(failures)


def execute_chunk(
    pipeline: Pipeline,
    bodies: Sequence[Any],
    *,
    chunk_id: str,
    redelivered: bool,
    requeue: Requeue,
    report_failures: ReportFailures | None = None,
) -> ChunkReport:
    """Run a chunk's requests for one time slice, storing each result; requeue the rest.

    ``report_failures`` is told of the failed invocations after their results are stored.
    """
    careful = pipeline.guard.chunk_redelivered(chunk_id, redelivered)
    work = _Slice(pipeline, careful, report_failures)
    started = time.monotonic()
    for start in range(0, len(bodies), CHECK_EVERY_N):
        if start and time.monotonic() - started > SLICE_S:
            work.flush()
            requeue(list(bodies[start:]))
            break
        work.run_group(bodies[start : start + CHECK_EVERY_N], start)
    work.flush()
    return ChunkReport(len(bodies), work.ran, work.skipped)
