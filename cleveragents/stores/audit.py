"""The audit trail of writes: an append-only log of what became of each write-capable invocation.

One event a line: ``request_id``, ``event`` (``EVENTS``), ``skill``, ``tool``,
``at`` (UTC, ISO 8601), ``digest`` (the request's content digest), and where it
applies ``by`` (the person who decided), ``reason`` (theirs), ``gate`` (which gate
refused), ``error_type``. Never an argument value: an event is built from names,
digests and the person's own words only (``event``).

On Redis a stream (``XADD`` capped near ``CLEVERAGENTS_AUDIT_MAXLEN``) that only
workers may write and no producer may trim (docs/deployment.md); on the embedded
default a JSONL file in the home, private to its user.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from cleveragents.constants import AUDIT_KEY
from cleveragents.stores.redis_retry import retrying

__all__ = [
    "EVENTS",
    "AuditLog",
    "FileAuditLog",
    "MemoryAuditLog",
    "RedisAuditLog",
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


class RedisAuditLog:
    """The trail as a Redis stream, capped near ``maxlen`` events."""

    def __init__(self, client: Any, maxlen: int) -> None:
        self.client = client
        self.maxlen = maxlen

    def append(self, events: list[dict[str, str]]) -> None:
        if not events:
            return

        def add() -> None:
            with self.client.pipeline(transaction=False) as pipe:
                for record in events:
                    pipe.xadd(AUDIT_KEY, record, maxlen=self.maxlen, approximate=True)
                pipe.execute()

        retrying(add)

    def read(
        self, *, request_id: str | None = None, since: dt.datetime | None = None
    ) -> Iterator[dict[str, str]]:
        start = _since_ms(since)
        while True:
            page = self._page(start)
            for _entry, fields in page:
                record = {_text(k): _text(v) for k, v in fields.items()}
                if request_id is None or record.get("request_id") == request_id:
                    yield record
            if len(page) < _PAGE:
                return
            start = "(" + _text(page[-1][0])

    def _page(self, start: str) -> list[Any]:
        return list(retrying(lambda: self.client.xrange(AUDIT_KEY, start, "+", count=_PAGE)))


class FileAuditLog:
    """The trail as a JSONL file, appended one whole line at a time (``O_APPEND``)."""

    def __init__(self, path: Path, maxlen: int) -> None:
        self.path = path
        #: Past about this many bytes (``maxlen`` events), the file is kept as ``.1``
        #: and a new one begun: two files at most.
        self.max_bytes = maxlen * 300

    def append(self, events: list[dict[str, str]]) -> None:
        if not events:
            return
        text = "".join(json.dumps(record, separators=(",", ":")) + "\n" for record in events)
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, text.encode())
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        if size > self.max_bytes:
            self.path.replace(self.path.with_suffix(".1.jsonl"))

    def read(
        self, *, request_id: str | None = None, since: dt.datetime | None = None
    ) -> Iterator[dict[str, str]]:
        for path in (self.path.with_suffix(".1.jsonl"), self.path):
            try:
                lines = path.read_text(encoding="utf-8").splitlines()
            except FileNotFoundError:
                continue
            for line in lines:
                try:
                    record = json.loads(line)
                except ValueError:  # a line cut by a crash: the others stand
                    continue
                if _wanted(record, request_id, since):
                    yield record


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
