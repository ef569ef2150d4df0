"""The audit trail of writes: an append-only log of what became of each write-capable invocation.

One event a line: ``request_id``, ``event`` (``EVENTS``), ``skill``, ``tool``,
``at`` (UTC, ISO 8601), ``digest`` (the request's content digest), and where it
applies ``by`` (the person who decided), ``reason`` (theirs), ``gate`` (which gate
refused), ``error_type``. Never an argument value: an event is built from names,
digests and the person's own words only (``event``).

On Redis a stream (``XADD`` capped near ``CLEVERAGENTS_AUDIT_MAXLEN``) that only
write workers may write and no producer may trim (docs/deployment.md), and one of
read-only workers' own (``cleveragents:ro:audit``); readers merge both. On the
embedded default a JSONL file in the home, private to its user. A worker's events
are sealed in a chain (``SealedAuditLog``, ``stores/audit_chain.py``), so that
``cleveragents audit --verify`` shows a gap, a trim or a forged event.
"""

from __future__ import annotations

import datetime as dt
import heapq
import threading
from collections.abc import Iterator
from functools import partial
from typing import Any, Protocol

from cleveragents.constants import AUDIT_KEY, READ_ONLY_AUDIT_KEY
from cleveragents.stores.audit_chain import AuditSealer, Stream
from cleveragents.stores.redis_retry import retrying

__all__ = [
    "EVENTS",
    "AuditLog",
    "MemoryAuditLog",
    "RedisAuditLog",
    "SealedAuditLog",
    "event",
]

#: Every event the trail holds, in the order an approved write that succeeds has them.
EVENTS = (
    "requested",
    "refused",
    "awaiting_approval",
    "approved",
    "rejected",
    "expired",
    "started",
    "succeeded",
    "failed",
)
#: The fields an event may carry beyond its own: nothing else is ever written.
_OPTIONAL = ("by", "reason", "gate", "error_type")
#: Events read from the stream per round trip.
_PAGE = 1000


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def event(
    name: str, request_id: str, skill: str, tool: str, digest: str, **extra: str | None
) -> dict[str, str]:
    """One audit event; ``extra`` only from ``by``, ``reason``, ``gate``, ``error_type``."""
    if name not in EVENTS:
        raise ValueError(f"unknown audit event {name!r}")
    record = {
        "request_id": request_id,
        "event": name,
        "skill": skill,
        "tool": tool,
        "at": _now(),
        "digest": digest,
    }
    for key in _OPTIONAL:
        value = extra.get(key)
        if value:
            record[key] = str(value)
    return record


def _since_ms(since: dt.datetime | None) -> str:
    return "-" if since is None else str(int(since.timestamp() * 1000))


class AuditLog(Protocol):
    """Where audit events are appended and read back, oldest first."""

    def append(self, events: list[dict[str, str]]) -> None:
        """Append ``events`` (one round trip)."""
        ...

    def read(
        self, *, request_id: str | None = None, since: dt.datetime | None = None
    ) -> Iterator[dict[str, str]]:
        """The events (of ``request_id``, at or after ``since``), oldest first."""
        ...

    def capped(self) -> bool:
        """Whether the trail has reached its cap (its oldest events may be gone by it)."""
        ...

    def streams(self) -> list[Stream]:
        """Each stream of the trail, oldest first, with whether it is at its cap
        (``audit_chain.verify`` checks them one by one)."""
        ...


class SealedAuditLog:
    """A worker's trail: every event it appends sealed in its process's chain."""

    def __init__(self, log: AuditLog, sealer: AuditSealer) -> None:
        self.log = log
        self.sealer = sealer

    def append(self, events: list[dict[str, str]]) -> None:
        if events:
            self.sealer.append(self.log, events)

    def read(
        self, *, request_id: str | None = None, since: dt.datetime | None = None
    ) -> Iterator[dict[str, str]]:
        return self.log.read(request_id=request_id, since=since)

    def capped(self) -> bool:
        return self.log.capped()

    def streams(self) -> list[Stream]:
        return self.log.streams()


#: Write workers' stream, then read-only workers' own.
STREAMS = (AUDIT_KEY, READ_ONLY_AUDIT_KEY)


class RedisAuditLog:
    """The trail as Redis streams, each capped near ``maxlen`` events: it appends to the
    first of ``streams`` and reads them all, merged in the order they were written."""

    def __init__(self, client: Any, maxlen: int, streams: tuple[str, ...] = STREAMS) -> None:
        self.client = client
        self.maxlen = maxlen
        #: The streams' keys: the first appended to, all read.
        self.names = streams

    def append(self, events: list[dict[str, str]]) -> None:
        if not events:
            return
        stream = self.names[0]

        def add() -> None:
            with self.client.pipeline(transaction=False) as pipe:
                for record in events:
                    pipe.xadd(stream, record, maxlen=self.maxlen, approximate=True)
                pipe.execute()

        retrying(add)

    def read(
        self, *, request_id: str | None = None, since: dt.datetime | None = None
    ) -> Iterator[dict[str, str]]:
        merged = heapq.merge(
            *(self._entries(stream, _since_ms(since)) for stream in self.names),
            key=lambda entry: entry[0],
        )
        for _place, record in merged:
            if request_id is None or record.get("request_id") == request_id:
                yield record

    def capped(self) -> bool:
        return any(self._at_cap(name) for name in self.names)

    def streams(self) -> list[Stream]:
        return [
            ((record for _, record in self._entries(name, "-")), self._at_cap(name))
            for name in self.names
        ]

    def _at_cap(self, name: str) -> bool:
        return int(retrying(partial(self.client.xlen, name))) >= self.maxlen

    def _entries(self, stream: str, start: str) -> Iterator[tuple[tuple[int, int], dict[str, str]]]:
        """One stream's events, oldest first, each with its place (its entry id)."""
        while True:
            page = list(retrying(partial(self.client.xrange, stream, start, "+", count=_PAGE)))
            for entry, fields in page:
                ms, _, seq = _text(entry).partition("-")
                yield (int(ms), int(seq or 0)), {_text(k): _text(v) for k, v in fields.items()}
            if len(page) < _PAGE:
                return
            start = "(" + _text(page[-1][0])


class MemoryAuditLog:
    """The trail in this process (tests)."""

    def __init__(self) -> None:
        self.events: list[dict[str, str]] = []
        self._lock = threading.Lock()

    def append(self, events: list[dict[str, str]]) -> None:
        with self._lock:
            self.events.extend(events)

    def read(
        self, *, request_id: str | None = None, since: dt.datetime | None = None
    ) -> Iterator[dict[str, str]]:
        with self._lock:
            kept = list(self.events)
        return (r for r in kept if _wanted(r, request_id, since))

    def capped(self) -> bool:
        return False

    def streams(self) -> list[Stream]:
        return [(self.read(), False)]


def _wanted(record: dict[str, str], request_id: str | None, since: dt.datetime | None) -> bool:
    if request_id is not None and record.get("request_id") != request_id:
        return False
    if since is None:
        return True
    try:
        at = dt.datetime.fromisoformat(record["at"].replace("Z", "+00:00"))
    except (KeyError, ValueError):
        return False
    return at >= since


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
