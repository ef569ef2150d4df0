"""A background batch's ids, sealed at submit: how many, and their digest.

A batch's ledger (its ids in input order) is written by its producer, under the
producer's Redis user, which every producer shares: another producer that learns
the batch id could append an id whose stored success is its own, and ``batch
results`` would write it as the batch's next line. So the submitting producer
seals the ledger once every id is recorded: the count and a SHA-256 of the ids
in order, under a key producers may make once (``SETNX``) and never replace,
expire or delete (docs/deployment.md, "Redis users per role"). ``batch status``
and ``batch results`` read no id past the seal, and a ledger whose ids are not
those sealed is reported as changed, never counted or written.

A batch still being submitted has no seal yet, nor does one an older version
submitted: its ledger is read as it is.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice

__all__ = [
    "BatchIdTaken",
    "LedgerChanged",
    "Seal",
    "SealedIds",
    "problem",
    "sealed",
    "wrong_length",
]


class BatchIdTaken(Exception):
    """A batch id whose seal exists already: another batch's, or a squatter's."""


class LedgerChanged(Exception):
    """A sealed batch's ledger holds other ids than those sealed."""


@dataclass(frozen=True)
class Seal:
    """How many ids a batch has, and the digest of them in order."""

    count: int
    digest: str

    def encode(self) -> str:
        """As stored: ``count:digest``."""
        return f"{self.count}:{self.digest}"

    @classmethod
    def decode(cls, raw: str | bytes) -> Seal:
        """The seal stored as ``raw`` (a malformed one: a seal no ledger matches)."""
        text = raw.decode() if isinstance(raw, bytes) else raw
        count, _, digest = text.partition(":")
        try:
            return cls(int(count), digest)
        except ValueError:
            return cls(-1, text)


class SealedIds:
    """The running count and digest of the ids a submission records."""

    def __init__(self) -> None:
        self.count = 0
        self._sha = hashlib.sha256()

    def add(self, ids: Iterable[str]) -> None:
        """Take ids, in order."""
        for rid in ids:
            self._sha.update(rid.encode() + b"\n")
            self.count += 1

    def seal(self) -> Seal:
        """The seal of every id taken."""
        return Seal(self.count, self._sha.hexdigest())


def problem(ids: Iterator[str], length: int, seal: Seal | None) -> str | None:
    """What is wrong with a ledger of ``length`` ids, read from ``ids`` (None: nothing, or
    no seal to check against). No id past the seal's count is read."""
    if seal is None:
        return None
    wrong = wrong_length(length, seal)
    if wrong is not None:
        return wrong
    running = SealedIds()
    running.add(islice(ids, seal.count))
    return None if running.seal() == seal else "its ids differ from those sealed"


def wrong_length(length: int, seal: Seal) -> str | None:
    """What is wrong with a ledger of ``length`` ids under ``seal`` that needs no id read."""
    return None if length == seal.count else f"{length} ids where {seal.count} were sealed"


def sealed(ids: Iterator[str], seal: Seal | None) -> Iterator[str]:
    """The ids up to the seal's count (every id, with no seal)."""
    return ids if seal is None else islice(ids, seal.count)
