"""The audit trail's chain: each event sealed with its place in its writer's chain, and the check.

Every process that appends audit events is a *writer* with an id of its own (made
when it first writes, and made anew after an append that may not have landed). Its
events carry ``chain`` (``<writer>/<n>``, n counting from 1), ``prev`` (the seal of
the writer's event before, empty for the first) and ``seal``: an HMAC-SHA256, under
``CLEVERAGENTS_AUDIT_KEY``, of all the event's other fields. So every event can be
checked on its own, wherever the trail now starts, and two events of one writer
must follow each other: n + 1, and ``prev`` the seal before. Chains per writer, not
one for the fleet: many workers append at once, and a fleet-wide chain would need a
lock around every append.

``verify`` reads a trail, stream by stream, and names what a writer of it could
have done without the key: an event with no seal or a wrong one (forged, padded or
changed), an event whose writer's number came before (a copy), an event that does
not follow the one before it, numbers missing inside a writer's chain (a gap), and
a chain that starts past 1 in a stream not yet at its cap (trimmed beyond the cap:
``XADD ... MAXLEN 1``). What it cannot see: events cut from the end of a chain
(nothing follows them), and anything done by someone holding both a worker's Redis
password and the key (docs/security.md).

Without a key the seal is a plain SHA-256 over the same text: gaps, trims and
events added by hand still show, but whoever knows this scheme can chain a forgery.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import os
import secrets
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["AuditSealer", "Stream", "TrailReport", "verify"]

#: The fields a sealed event carries beyond its own.
CHAIN, PREV, SEAL = "chain", "prev", "seal"


def _mac(key: bytes | None, fields: dict[str, str]) -> str:
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    if key is None:
        return hashlib.sha256(text.encode()).hexdigest()
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def _key(secret: str | None) -> bytes | None:
    return secret.encode() if secret else None


class AuditSealer:
    """One process's chain: seals the events it appends, in order (thread-safe). An
    append that fails may or may not have landed: the chain goes on as a new one (a
    number written twice or skipped would read as tampering)."""

    def __init__(self, secret: str | None) -> None:
        self._key = _key(secret)
        self._lock = threading.Lock()
        self._new_chain()

    def _new_chain(self) -> None:
        self.writer = secrets.token_hex(8)
        self._n = 0
        self._previous = ""
        self._pid = os.getpid()

    def append(self, log: Any, events: list[dict[str, str]]) -> None:
        """Seal ``events`` and append them to ``log`` in one step of this chain (another
        thread's events never come between a seal and its append)."""
        with self._lock:
            if self._pid != os.getpid():  # a forked child: a chain of its own
                self._new_chain()
            try:
                log.append(self._seal(events))
            except BaseException:
                self._new_chain()
                raise

    def _seal(self, events: list[dict[str, str]]) -> list[dict[str, str]]:
        """``events`` with their place in this writer's chain and their seals."""
        sealed = []
        for record in events:
            self._n += 1
            fields = {k: v for k, v in record.items() if k not in (CHAIN, PREV, SEAL)}
            fields[CHAIN] = f"{self.writer}/{self._n}"
            fields[PREV] = self._previous
            self._previous = _mac(self._key, fields)
            sealed.append({**fields, SEAL: self._previous})
        return sealed


@dataclass
class TrailReport:
    """What ``verify`` found: each problem one line, and the counts."""

    events: int = 0
    writers: int = 0
    problems: list[str] = field(default_factory=list)
    #: Whether the seals were checked under a key (else only the chain's shape).
    keyed: bool = False

    @property
    def whole(self) -> bool:
        return not self.problems


def _named(record: dict[str, str]) -> str:
    what = f"{record.get('event', '?')} of {record.get('request_id', '?')}"
    return f"{what} at {record.get('at', '?')}"


#: One stream of a trail as ``verify`` reads it: its events oldest first, and whether it
#: has reached its cap (its oldest events may then have been dropped by the cap itself).
Stream = tuple[Iterable[dict[str, str]], bool]


def verify(streams: Iterable[Stream], secret: str | None) -> TrailReport:
    """Check a trail, stream by stream (a writer writes one stream only)."""
    key = _key(secret)
    report = TrailReport(keyed=key is not None)
    for events, capped in streams:
        chains: dict[str, list[tuple[int, dict[str, str]]]] = {}
        previous: dict[str, tuple[int, str]] = {}
        for record in events:
            report.events += 1
            problem = _check(key, record, chains, previous)
            if problem is not None:
                report.problems.append(problem)
        report.writers += len(chains)
        for writer, chain in chains.items():
            report.problems += _holes(writer, chain, capped)
    return report


def _check(
    key: bytes | None,
    record: dict[str, str],
    chains: dict[str, list[tuple[int, dict[str, str]]]],
    previous: dict[str, tuple[int, str]],
) -> str | None:
    """What is wrong with one event in its place (None: nothing), noting its place."""
    writer, n = _place(record.get(CHAIN, ""))
    if writer is None:
        return f"forged: {_named(record)} carries no seal of a worker"
    fields = {k: v for k, v in record.items() if k != SEAL}
    if not hmac.compare_digest(_mac(key, fields), record.get(SEAL, "")):
        return f"forged: {_named(record)} has a seal that does not verify"
    last_n, last_seal = previous.get(writer, (0, ""))
    if writer in previous and n <= last_n:
        return f"forged: {_named(record)} repeats event {n} of writer {writer} (a copy)"
    if writer in previous and n == last_n + 1 and record.get(PREV, "") != last_seal:
        return f"forged: {_named(record)} does not follow writer {writer}'s event {last_n}"
    chains.setdefault(writer, []).append((n, record))
    previous[writer] = (n, record.get(SEAL, ""))
    return None


def _place(chain: str) -> tuple[str | None, int]:
    writer, _, number = chain.partition("/")
    if not writer or not number.isdigit() or int(number) < 1:
        return None, 0
    return writer, int(number)


def _holes(writer: str, chain: list[tuple[int, dict[str, str]]], capped: bool) -> list[str]:
    """Gaps inside one writer's chain, and a start past 1 on a trail below its cap."""
    holes = []
    numbers = sorted({n for n, _ in chain})
    first = chain[0]
    if numbers[0] > 1 and not capped:
        holes.append(
            f"trimmed: writer {writer}'s first {numbers[0] - 1} event(s), before "
            f"{_named(first[1])}, are gone while the trail is below its cap"
        )
    for before, after in itertools.pairwise(numbers):
        if after != before + 1:
            holes.append(f"gap: writer {writer}'s events {before + 1} to {after - 1} are missing")
    return holes
