"""``execute_chunk``: many invocations of one message, a time slice at a time.

Each request still gets its own gating, validation and timeout (the runtime), and
its own ``SkillResult`` under its own request id. A request whose result is
already stored (a redelivered chunk, a resumed batch) is not run again, nor is an
id seen twice in one chunk. The clock is read after every invocation: once the
slice (``SLICE_S``) is over, the results are stored and the requests not yet run
are handed to ``requeue``, so that the process turns to other queues in between:
an interactive invocation never waits behind a whole chunk. (Quick tools finish
the group of requests looked up together first, for at most ``TAIL_S`` more,
unless ``others_waiting`` says an interactive invocation waits: then they stop.)
The lookups are sized by time too: a group holds what is left of the slice at the
rate measured so far (``FIRST_GROUP`` to ``MAX_GROUP`` requests), so quick tools
cost two round trips (a lookup, a bind) per slice rather than per 32.

The rest is sized by time, not by count: what the slice measured per invocation
says how long the rest will take, and a rest longer than ``PIECE_S`` goes back as
several messages of about ``PIECE_S`` each (at most ``MAX_PIECES``), which other
processes take at once. A chunk of slow tools thus spreads over every process of
every worker within a slice or two, whatever its size; a chunk of fast tools,
whose rest takes less than ``PIECE_S``, goes back whole, as one message.

Going back costs a message (encoding the rest, a publish, a delivery, its
lookups), and is only worth it when something else waits: a quick rest stays in
its process for another slice when ``others_waiting`` (the worker's interactive
queues) says nothing waits, for at most ``STAY_S`` in all.

A chunk of more than ``MAX_CHUNK_ITEMS`` requests (a raw producer's: ours send
fewer) first sends the ones past it back, in messages of that many, so that what
a worker weighs per delivery (its hard time limit) stays bounded.

The invocations that failed are handed to ``report_failures`` once their results
are stored (a worker shows each in Flower as its own failed row); successes are
only counted.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from cleveragents.constants import MAX_CHUNK_ITEMS
from cleveragents.pipeline.binding import content_digest, reused_result
from cleveragents.pipeline.delivery import PARKED, RETRY, WAIT, Delivery
from cleveragents.pipeline.invocation import Pipeline
from cleveragents.runtime.outcomes import text_field
from cleveragents.runtime.text import lone_surrogate
from cleveragents.skills import SkillResult

__all__ = [
    "FIRST_GROUP",
    "FLUSH_EVERY_N",
    "MAX_CHUNK_ITEMS",
    "MAX_GROUP",
    "MAX_PIECES",
    "PIECE_S",
    "SLICE_S",
    "STAY_S",
    "TAIL_S",
    "ChunkReport",
    "ItemFailure",
    "ReportFailures",
    "Requeue",
    "Sender",
    "execute_chunk",
    "pieces",
]

#: A chunk runs for about this long, plus the invocation under way, before the rest of
#: it is requeued.
SLICE_S = 0.02
#: Requests whose stored results are looked up (and ids bound) at once, before anything
#: is measured, and the fewest in any group: a group is then sized to fill what is left
#: of the slice at the rate measured (each lookup is a round trip: about 0.1 ms of CPU).
FIRST_GROUP = 32
#: The most requests looked up at once.
MAX_GROUP = 256
#: Past the slice, the rest of a looked-up group still runs when it is expected to take
#: at most this long, and never starts later than this past the slice: quick tools
#: then end their slices at a group's end (fewer, longer slices: each message costs
#: milliseconds), and look nothing up twice. The hard time limit counts on it.
TAIL_S = SLICE_S
#: Results are written at least every this many invocations.
FLUSH_EVERY_N = 250
#: The rest of a chunk goes back in messages of about this much work each (as measured
#: in the slice): each costs a publish, a delivery and its lookups, a few milliseconds.
PIECE_S = 0.25
#: At most this many messages for the rest of one slice (each splits again in its turn).
MAX_PIECES = 16
#: A chunk whose quick rest would go back while nothing else waits runs on instead,
#: slice after slice, for at most this long (the hard time limit counts on it).
STAY_S = 0.25

#: Sends some requests of a chunk not yet run (from this index in the chunk on) back to
#: the end of its queue as a new message, with this id.
Requeue = Callable[[list[Any], int, str], None]


@dataclass(frozen=True)
class Sender:
    """Who sent a chunk (Celery's ``origin``) and the trace context its message carried."""

    asked_by: str | None = None
    trace: Mapping[str, str] | None = None


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

#: Whether another message waits for this process (an interactive invocation).
OthersWaiting = Callable[[], bool]
#: Sends one request back to the broker on its own, with a delay (its body, its id, the
#: delay in seconds, and whether it is a retry rather than a wait for a limit).
Defer = Callable[[Any, str, float, bool], None]


@dataclass(frozen=True)
class ChunkReport:
    """What one slice of a chunk did."""

    invocations: int
    ran: int
    skipped: int

    def as_dict(self) -> dict[str, int]:
        """The report as the task's return value."""
        return asdict(self)


class _Clock:
    """The time slice of one chunk message, and how long its invocations took."""

    def __init__(self, others_waiting: OthersWaiting | None = None) -> None:
        self.began = time.monotonic()
        self.until = self.began + SLICE_S
        self.durations: list[float] = []
        self.typical: float | None = None
        self.group = FIRST_GROUP
        self.others_waiting = others_waiting
        #: What ``others_waiting`` said once this slice was over (asked once a slice).
        self.waiting: bool | None = None

    def may_stay(self) -> bool:
        """Whether another slice fits in the time a chunk may stay (``STAY_S``)."""
        return time.monotonic() + SLICE_S <= self.began + STAY_S

    def next_slice(self) -> None:
        """Start another slice, measured afresh."""
        self.until = time.monotonic() + SLICE_S
        self.durations, self.typical, self.waiting = [], None, None

    def expired(self) -> bool:
        """Whether the slice is over."""
        return time.monotonic() >= self.until

    def per_item_s(self) -> float:
        """A typical invocation's time in this slice (0 when none ran), taken once.

        The median: a moment of the process waiting for a core on a busy machine
        does not move it, so a chunk of quick tools is not split for nothing.
        """
        if self.typical is None:
            self.typical = statistics.median(self.durations) if self.durations else 0.0
        return self.typical

    def group_size(self) -> int:
        """How many requests to look up next: as many as fit in what is left of the slice
        at the rate of the last ones (``FIRST_GROUP`` to ``MAX_GROUP``; as before when none
        ran since), so that a group ends about when the slice does, and the question
        whether something else waits comes on time."""
        recent = self.durations[-FIRST_GROUP:]
        if recent:
            each = statistics.median(recent)
            left = max(self.until - time.monotonic(), 0.0)
            fits = int(left / each) if each > 0 else MAX_GROUP
            self.group = max(FIRST_GROUP, min(MAX_GROUP, fits))
        return self.group

    def over(self, left_in_group: int) -> bool:
        """Whether to stop now: the slice is over, and ``TAIL_S`` past it too, or the last
        invocation was slow, or the group's rest, at the typical invocation's time, is not
        quick, or something else waits for this process (or nothing says: RabbitMQ). So
        no invocation starts later than ``TAIL_S`` past the slice, and none at all past
        it while an interactive invocation waits."""
        now = time.monotonic()
        if now < self.until:
            return False
        if now >= self.until + TAIL_S or self.durations[-1] > TAIL_S:
            return True
        if left_in_group * self.per_item_s() > TAIL_S:
            return True
        if self.others_waiting is None:
            return True
        if self.waiting is None:  # a round trip: once a slice, not once an invocation
            self.waiting = self.others_waiting()
        return self.waiting

    def waits_now(self) -> bool:
        """Whether something else waits for this process, as the slice ends: what ``over``
        was told when that said yes (a moment ago), else asked afresh."""
        if self.others_waiting is None:
            return True
        if not self.waiting:
            self.waiting = self.others_waiting()
        return self.waiting


class _Slice:
    """The state of one slice: results not yet stored, ids seen, counts."""

    def __init__(
        self,
        pipeline: Pipeline,
        careful: bool,
        report: ReportFailures | None = None,
        defer: Defer | None = None,
        sender: Sender = Sender(),
    ) -> None:
        self.pipeline = pipeline
        self.sender = sender
        self.report = report
        self.defer = defer
        self.failures: list[ItemFailure] = []
        # A chunk that came back may hold the invocation that kills its process:
        # each of its invocations counts its own deliveries and is stored at once,
        # so that only that one is ever run again.
        self.careful = careful
        self.pending: list[tuple[str, SkillResult]] = []
        self.seen: set[str] = set()
        self.ran = self.skipped = 0

    def run_group(self, bodies: Sequence[Any], offset: int, clock: _Clock) -> int:
        """Run the requests of ``bodies`` (from ``offset`` in the chunk) not yet stored.

        Tells ``clock`` how long each invocation took and stops once it says so;
        returns how many requests of ``bodies`` it went through (ran or skipped).
        """
        # An id no Redis key can hold (half a surrogate pair) is no id: skipped, as is none
        ids = [_usable(text_field(body, "request_id")) for body in bodies]
        done = self._finished(bodies, ids) | self._bound_elsewhere(bodies, ids)
        through = 0
        for index, (body, rid) in enumerate(zip(bodies, ids, strict=True), offset):
            through += 1
            if not rid or rid in done or rid in self.seen:
                self.skipped += 1  # no id to store a result under, or already finished
                continue
            self.seen.add(rid)  # the same id twice in one chunk runs once
            started, began = time.time(), time.monotonic()
            result = self._run(body, rid)
            if result is None:  # sent back to wait: its result comes from that message
                self.ran += 1
                continue
            if not result.success and self.report is not None:
                runtime = time.monotonic() - began
                self.failures.append(ItemFailure(index, rid, body, result, started, runtime))
            self.pending.append((rid, result))
            self.ran += 1
            clock.durations.append(time.monotonic() - began)
            if self.careful:
                self.flush()
            if clock.over(len(bodies) - through):
                break
        if len(self.pending) >= FLUSH_EVERY_N:
            self.flush()
        return through

    def _run(self, body: Any, rid: str) -> SkillResult | None:
        """One line's result, inside its span where the worker traces (``line_span``)."""
        spans = self.pipeline.line_span
        if spans is None:
            return self._run_line(body, rid)
        with spans(body, rid) as record:
            result = self._run_line(body, rid)
            record(result, None if result is not None else "sent back")
            return result

    def _run_line(self, body: Any, rid: str) -> SkillResult | None:
        """One line's result; None where it went back to the broker on its own, to wait
        for its tool's limits or for its retry, or waits for approval (a chunk never
        waits on one line). What becomes of it is the pipeline's to decide."""
        delivery = Delivery(
            body,
            rid,
            redelivered=self.careful,
            chunk_item=True,
            asked_by=self.sender.asked_by,
            trace=self.sender.trace,
            may_send_back=self.defer is not None,
        )
        outcome = self.pipeline.deliver(delivery)
        if outcome.kind in (WAIT, RETRY):
            assert self.defer is not None
            self.defer(body, rid, outcome.delay_s, outcome.kind == RETRY)
            return None
        if outcome.kind == PARKED:  # its result comes from the delivery a decision sends
            return None
        return outcome.result

    def _bound_elsewhere(self, bodies: Sequence[Any], ids: list[str]) -> set[str]:
        """Ids bound to other content: run nothing, store nothing (``pipeline/binding.py``)."""
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


def _usable(request_id: str) -> str:
    return "" if lone_surrogate(request_id) else request_id


def pieces(count: int, per_item_s: float) -> list[int]:
    """How many requests each message of a rest of ``count`` carries, in order.

    About ``PIECE_S`` of work each at ``per_item_s`` an invocation, at most
    ``MAX_PIECES`` of them, as even as they go; one message when the rest is quick.
    """
    wanted = int(count * per_item_s / PIECE_S)
    n = max(1, min(wanted, MAX_PIECES, count))
    return [count // n + (1 if i < count % n else 0) for i in range(n)]


def execute_chunk(
    pipeline: Pipeline,
    bodies: Sequence[Any],
    *,
    chunk_id: str,
    redelivered: bool,
    requeue: Requeue,
    report_failures: ReportFailures | None = None,
    others_waiting: OthersWaiting | None = None,
    defer: Defer | None = None,
    sender: Sender = Sender(),
) -> ChunkReport:
    """Run a chunk's requests for one time slice, storing each result; requeue the rest.

    The rest goes back in one or more messages, sized by the time the slice took per
    invocation (``pieces``). A rest that would go back whole runs on for another
    slice instead while ``others_waiting`` says nothing waits (``STAY_S`` at most;
    without it, the rest always goes back). ``report_failures`` is told of the
    failed invocations after their results are stored. ``sender``: who sent the
    chunk and in which trace (kept with a line that waits for approval).
    """
    careful = pipeline.guard.chunk_redelivered(chunk_id, redelivered)
    invocations = len(bodies)
    if invocations > MAX_CHUNK_ITEMS:
        over = invocations - MAX_CHUNK_ITEMS
        sizes = [min(MAX_CHUNK_ITEMS, over - at) for at in range(0, over, MAX_CHUNK_ITEMS)]
        _send_back(pipeline, careful, requeue, bodies, MAX_CHUNK_ITEMS, sizes)
        bodies = bodies[:MAX_CHUNK_ITEMS]
    work = _Slice(pipeline, careful, report_failures, defer, sender)
    clock = _Clock(others_waiting)
    done = 0
    while done < len(bodies):
        done += work.run_group(bodies[done : done + clock.group_size()], done, clock)
        if done < len(bodies) and clock.expired():
            work.flush()
            sizes = pieces(len(bodies) - done, clock.per_item_s())
            quick = len(sizes) == 1 and clock.may_stay()
            if quick and others_waiting is not None and not clock.waits_now():
                clock.next_slice()
                continue
            _send_back(pipeline, careful, requeue, bodies, done, sizes)
            break
    work.flush()
    return ChunkReport(invocations, work.ran, work.skipped)


def _send_back(
    pipeline: Pipeline,
    careful: bool,
    requeue: Requeue,
    bodies: Sequence[Any],
    start: int,
    sizes: list[int],
) -> None:
    """Requeue ``bodies`` from ``start`` on as messages of ``sizes`` requests, in order."""
    for size in sizes:
        rest_id = str(uuid.uuid4())
        if careful:  # the rest of a chunk that came back: with care too
            pipeline.guard.care_for_rest(rest_id)
        requeue(list(bodies[start : start + size]), start, rest_id)
        start += size
