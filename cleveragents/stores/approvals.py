"""Where parked invocations and decisions are kept: in memory, or in files (the embedded default).

Both keep the rules of ``model.py`` under one lock: the file store under an
exclusive ``flock`` that holds across the processes of the home (the worker's and
the CLI's). The Redis store (``approvals_redis.py``) keeps them in two scripts.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Protocol

from cleveragents.approvals.model import WAITING, Decision, Parked, Resolution, decide, resolve

__all__ = ["ApprovalStore", "MemoryApprovalStore"]


class ApprovalStore(Protocol):
    """Parked invocations, the decisions about them, and the order they were asked in."""

    def resolve(self, asked: Parked, ttl_s: float) -> Resolution:
        """A worker's delivery of ``asked``: park it, or find what became of it."""
        ...

    def decide(self, request_id: str, wanted: Decision) -> tuple[Parked, Decision]:
        """A person's decision, stored once (``ApprovalError`` when it cannot be)."""
        ...

    def get(self, request_id: str) -> tuple[Parked | None, Decision | None]:
        """The record and decision of ``request_id`` (None: there is none)."""
        ...

    def waiting(self, limit: int = 1000) -> list[tuple[Parked, Decision | None]]:
        """The parked invocations not yet settled by a worker, oldest first."""
        ...

    def parked_read_only(self, request_id: str) -> bool:
        """Whether it was parked under read-only workers' own keys (they may send no write)."""
        ...


class _Local:
    """The rules over a dict-like keeping of records and decisions (a subclass keeps them)."""

    def _locked(self) -> Any:
        raise NotImplementedError

    def _load(self, request_id: str) -> tuple[Parked | None, Decision | None]:
        raise NotImplementedError

    def _save(self, request_id: str, record: Parked | None, decision: Decision | None) -> None:
        raise NotImplementedError

    def _ids(self) -> list[str]:
        raise NotImplementedError

    def resolve(self, asked: Parked, ttl_s: float) -> Resolution:
        with self._locked():
            record, decision = self._load(asked.request_id)
            resolution, keep = resolve(record, decision, asked, time.time(), ttl_s)
            if keep is not None:
                self._save(asked.request_id, keep, decision)
            return resolution

    def decide(self, request_id: str, wanted: Decision) -> tuple[Parked, Decision]:
        with self._locked():
            record, existing = self._load(request_id)
            decision = decide(request_id, record, existing, wanted, time.time())
            assert record is not None  # decide raised otherwise
            self._save(request_id, record, decision)
            return record, decision

    def get(self, request_id: str) -> tuple[Parked | None, Decision | None]:
        with self._locked():
            return self._load(request_id)

    def parked_read_only(self, request_id: str) -> bool:
        return False  # one fleet: the home's user's

    def waiting(self, limit: int = 1000) -> list[tuple[Parked, Decision | None]]:
        with self._locked():
            found = [self._load(request_id) for request_id in self._ids()]
        kept = [(r, d) for r, d in found if r is not None and r.state == WAITING]
        kept.sort(key=lambda pair: pair[0].asked_at)
        return kept[:limit]


class MemoryApprovalStore(_Local):
    """Approvals in this process (tests, and a pipeline built without stores)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: dict[str, tuple[Parked | None, Decision | None]] = {}

    def _locked(self) -> Any:
        return self._lock

    def _load(self, request_id: str) -> tuple[Parked | None, Decision | None]:
        return self._records.get(request_id, (None, None))

    def _save(self, request_id: str, record: Parked | None, decision: Decision | None) -> None:
        self._records[request_id] = (record, decision)

    def _ids(self) -> list[str]:
        return list(self._records)


def _parked(fields: dict[str, Any]) -> Parked:
    times = {k: fields.pop(k) for k in ("asked_at", "expires_at", "state")}
    return Parked(**fields, **times)


def _decision(fields: dict[str, Any] | None) -> Decision | None:
    return Decision(**fields) if fields else None
