"""The audit trail's chain: each event sealed over its writer's previous one, and the check.

Every process that appends audit events is a *writer* with an id of its own (made
when it first writes, and made anew after an append that may not have landed). Its
events carry ``chain`` (``<writer>/<n>``, n counting from 1) and ``seal``: an
HMAC-SHA256, under ``CLEVERAGENTS_AUDIT_KEY``, of the event's other fields and the
writer's previous seal. Chains per writer, not one for the fleet: many workers
append at once, and a fleet-wide chain would need a lock around every append.

``verify`` reads a trail and names what a writer of it could have done without the
key: an event with no seal or a wrong one (forged, or changed), an event whose
writer's number came before (a copy), numbers missing inside a writer's chain (a
gap), and a chain that starts past 1 on a trail not yet at its cap (trimmed beyond
the cap: ``XADD ... MAXLEN 1``). What it cannot see: events cut from the end of a
chain (nothing follows them), and anything done by someone holding both a worker's
Redis password and the key (docs/security.md).

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

__all__ = ["AuditSealer", "TrailReport", "verify"]

#: The fields a sealed event carries beyond its own.
CHAIN, SEAL = "chain", "seal"


def _mac(key: bytes | None, fields: dict[str, str], previous: str) -> str:
    text = json.dumps(fields, sort_keys=True, separators=(",", ":")) + "\n" + previous
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
            fields = {k: v for k, v in record.items() if k not in (CHAIN, SEAL)}
            fields[CHAIN] = f"{self.writer}/{self._n}"
            self._previous = _mac(self._key, fields, self._previous)
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


def verify(events: Iterable[dict[str, str]], secret: str | None, *, capped: bool) -> TrailReport:
    """Check a trail read oldest first (``capped``: it has reached its cap, so its oldest
    events may have been dropped by the cap itself)."""
    key = _key(secret)
    report = TrailReport(keyed=key is not None)
    chains: dict[str, list[tuple[int, dict[str, str]]]] = {}
    previous: dict[str, tuple[int, str]] = {}
    for record in events:
        report.events += 1
        writer, n = _place(record.get(CHAIN, ""))
        if writer is None:
            report.problems.append(f"forged: {_named(record)} carries no seal of a worker")
            continue
        chains.setdefault(writer, []).append((n, record))
        fields = {k: v for k, v in record.items() if k != SEAL}
        last_n, last_seal = previous.get(writer, (0, ""))
        if n <= last_n:
            report.problems.append(
                f"forged: {_named(record)} repeats event {n} of writer {writer} (a copy)"
            )
            continue
        expected_previous = last_seal if n == last_n + 1 else None
        if expected_previous is not None and not hmac.compare_digest(
            _mac(key, fields, expected_previous), record.get(SEAL, "")
        ):
            report.problems.append(f"forged: {_named(record)} has a seal that does not verify")
            continue
        previous[writer] = (n, record.get(SEAL, ""))
    report.writers = len(chains)
    for writer, chain in chains.items():
        report.problems += _holes(writer, chain, capped)
    return report


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
