"""The four kinds of state beside the queue, one protocol each, and the records they keep.

Policy (the guard, the pipeline, the batch runner, the metrics recorder) only
calls these methods; which implementation it holds (Redis, files, memory) was
chosen once, by ``cleveragents.stores.open_stores``.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from cleveragents.skills import SkillResult

__all__ = [
    "BatchLedger",
    "Binding",
    "Claim",
    "GuardStore",
    "MetricCounts",
    "MetricStore",
    "ResultStore",
    "StartedMark",
    "bind_then_start",
]

_HOST = socket.gethostname()


@dataclass(frozen=True)
class Claim:
    """Who started a write, until when it may still be running, and its result once done."""

    host: str
    pid: int
    until: float
    done: dict[str, Any] | None = None
    #: Tells two claims of one process apart (a store recognises its own after a retry).
    token: str = ""

    @classmethod
    def mine(cls, for_s: float) -> Claim:
        """A new claim by this process that may run for ``for_s`` seconds from now."""
        return cls(_HOST, os.getpid(), time.time() + for_s, token=uuid.uuid4().hex)

    @classmethod
    def finished(cls, payload: dict[str, Any]) -> Claim:
        """The claim of a write that has finished with ``payload``."""
        return cls(_HOST, os.getpid(), 0.0, payload)

    def owner_alive(self) -> bool:
        """False when the owner is known to be dead (same host, no such process)."""
        if self.host != _HOST:
            return True  # another machine: trust its deadline
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def may_still_run(self) -> bool:
        """True while the first run may still finish and store its result."""
        return time.time() < self.until and self.owner_alive()

    def same_as(self, other: Claim) -> bool:
        """True when ``other`` is this very claim (as stored and read back)."""
        return bool(self.token) and self.token == other.token

    def running(self) -> bool:
        """True while the write is unfinished and its first run may still finish it."""
        return self.done is None and self.may_still_run()

    def encode(self) -> str:
        """The claim as stored: one JSON object."""
        data: dict[str, Any] = {"host": self.host, "pid": self.pid, "until": self.until}
        if self.done is not None:
            data["done"] = self.done
        if self.token:
            data["token"] = self.token
        return json.dumps(data)

    @classmethod
    def decode(cls, raw: str | bytes) -> Claim:
        """A stored claim; an unreadable one reads as a claim whose owner is long gone."""
        try:
            data = json.loads(raw)
            done = data.get("done")
            return cls(
                str(data["host"]),
                int(data["pid"]),
                float(data["until"]),
                done if isinstance(done, dict) else None,
                str(data.get("token") or ""),
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            return cls("", 0, 0.0)


@dataclass(frozen=True)
class StartedMark:
    """The state a delivery stores as its run starts: Celery's ``STARTED``.

    ``write`` stores it through the result backend. Beside a Redis result backend
    it is also given encoded (``value`` under ``key``, ``ttl_s``: 0 for none), so
    that a store in the same Redis can write it in the round trip of the bind
    (``GuardStore.bind_starting``); ``key`` is None where it cannot be.
    """

    write: Callable[[], None]
    key: str | None = None
    value: str | bytes = ""
    ttl_s: int = 0


class Binding(NamedTuple):
    """What ``GuardStore.bind_starting`` found and did."""

    #: The digest the id was bound to before (None: this call bound it).
    before: str | None
    #: Whether the ``StartedMark`` was stored: the run starts.
    started: bool
    #: The id was cancelled (``GuardStore.cancel``) before any run of it started:
    #: nothing was stored, and it must not run.
    cancelled: bool = False


def bind_then_start(store: GuardStore, request_id: str, digest: str, mark: StartedMark) -> Binding:
    """``GuardStore.bind_starting`` in two steps: bind, then store ``mark`` if the id was free."""
    [before] = store.bind([(request_id, digest)])
    if before is None:
        mark.write()
    return Binding(before, before is None)


@dataclass
class MetricCounts:
    """Counters of finished invocations: by outcome, by duration bucket, and summed seconds.

    Keys are JSON arrays: ``[skill, tool, outcome, error_type, reason]`` for
    ``invocations``, ``[skill, tool, outcome, bucket]`` for ``durations`` and
    ``[skill, tool, outcome]`` for ``sums``. A count of zero is kept: adding it
    makes the series exist (``cleveragents.metrics.recorder.zero_counts``).
    """

    invocations: Counter[str] = field(default_factory=Counter)
    durations: Counter[str] = field(default_factory=Counter)
    sums: dict[str, float] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.invocations or self.durations or self.sums)

    def add(self, other: MetricCounts) -> None:
        """Add ``other``'s counts to these."""
        self.invocations.update(other.invocations)
        self.durations.update(other.durations)
        for key, seconds in other.sums.items():
            self.sums[key] = self.sums.get(key, 0.0) + seconds


class GuardStore(Protocol):
    """Attempt counters, write claims and dead letters of the at-most-once guard."""

    @property
    def marks_redeliveries(self) -> bool:
        """True when the broker beside this store marks redelivered messages.

        Then only redeliveries need counting (a first delivery costs nothing); else
        every delivery is counted, and a chunk counts its own deliveries.
        """
        ...

    def attempt(self, request_id: str) -> int:
        """Count one more delivery of ``request_id``; return how many have been counted."""
        ...

    def claim(self, request_id: str, claim: Claim) -> Claim | None:
        """Take the write claim atomically: None when taken, else the claim already held.

        Taking the same claim again (a retry) succeeds: the store recognises its token.
        """
        ...

    def read_claim(self, request_id: str) -> Claim | None:
        """The write claim of ``request_id``, if any."""
        ...

    def finish(self, request_id: str, payload: dict[str, Any]) -> None:
        """Record the result of a claimed write in its claim."""
        ...

    def dead_letter(self, request_id: str, record: dict[str, Any]) -> None:
        """Keep a poison invocation for inspection (newest first, the last 10,000)."""
        ...

    def bind(self, pairs: Sequence[tuple[str, str]]) -> list[str | None]:
        """Bind each request id to its content digest, atomically, where it is not bound yet.

        Returns, for each pair, the digest the id was bound to before (None when this
        call bound it). Binding the same digest again is harmless.
        """
        ...

    def binding(self, request_id: str) -> str | None:
        """The digest ``request_id`` is bound to, or None when nothing used it (or it expired)."""
        ...

    def bind_starting(self, request_id: str, digest: str, mark: StartedMark) -> Binding:
        """``bind`` one id, and store ``mark`` where its run starts for sure.

        That is where the id was free; a store that can read the stored result in
        the same round trip (Redis) also stores it where the id is bound to this
        digest and no finished result is stored, and there finds a cancel mark of
        an id that never started (then stores nothing).
        """
        ...

    def cancel(self, request_id: str) -> bool:
        """Mark ``request_id`` cancelled, for a worker to find before its run starts;
        False where this store cannot (the in-memory double's)."""
        ...


class ResultStore(Protocol):
    """Finished ``SkillResult``s in Celery's own result format, many at a time."""

    def get_payloads(self, request_ids: Sequence[str]) -> list[dict[str, Any] | None]:
        """The stored payload of each id (None where there is none yet), in order."""
        ...

    def reusable(
        self, request_ids: Sequence[str], allow_writes: Sequence[bool]
    ) -> list[dict[str, Any] | None]:
        """The stored payload of each id where it answers that request, else None (a
        refusal for want of writes does not answer the request sent with writes)."""
        ...

    def forget(self, request_ids: Sequence[str]) -> None:
        """Delete the stored results of ``request_ids``."""
        ...

    def put_many(self, items: Iterable[tuple[str, SkillResult]]) -> None:
        """Store finished results, each under its own request id."""
        ...


class BatchLedger(Protocol):
    """The ordered request ids and the description of each background batch."""

    def set_meta(self, batch_id: str, meta: dict[str, Any]) -> None:
        """Record (or replace) what the batch is: its file, counts, times."""
        ...

    def meta(self, batch_id: str) -> dict[str, Any] | None:
        """The batch's description, or None when there is no such batch."""
        ...

    def append(self, batch_id: str, request_ids: Sequence[str]) -> None:
        """Add request ids behind those already recorded."""
        ...

    def ids(self, batch_id: str) -> Iterator[str]:
        """The batch's request ids, in input order."""
        ...

    def length(self, batch_id: str) -> int:
        """How many request ids the batch's ledger holds."""
        ...

    def seal(self, batch_id: str, seal: str) -> str | None:
        """Make the batch's seal (``cleveragents.batch.seal``), once: None when made, else
        the seal already there, which stays."""
        ...

    def seal_of(self, batch_id: str) -> str | None:
        """The batch's seal, if it has one."""
        ...

    def refuse(self, batch_id: str, payloads: Sequence[tuple[str, dict[str, Any]]]) -> None:
        """Keep the results of lines answered without being sent (not a valid request, or
        an id bound to another request), by request id: a producer stores no result."""
        ...

    def refusals(self, batch_id: str, request_ids: Sequence[str]) -> list[dict[str, Any] | None]:
        """The kept result of each id (None where its line was sent), in order."""
        ...


class MetricStore(Protocol):
    """Where worker processes add their invocation counters, and the exporter reads them."""

    def add(self, counts: MetricCounts) -> None:
        """Add ``counts`` to the totals."""
        ...

    def totals(self) -> MetricCounts:
        """Every count added so far (by any process sharing this store)."""
        ...
