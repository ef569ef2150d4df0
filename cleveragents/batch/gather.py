"""Collect results in input order with bulk reads, holding only a bounded window in memory."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from cleveragents.stores import ResultStore

__all__ = ["Entry", "OrderedGather"]

#: At most this many ids are asked for in one bulk read.
READ_BATCH = 2000


@dataclass
class Entry:
    """One request of a batch, waiting for (or holding) its stored payload."""

    line: int
    request_id: str
    skill: str = ""
    tool: str = ""
    payload: dict[str, Any] | None = field(default=None)


class OrderedGather:
    """Entries in input order; ``poll`` fetches missing payloads and releases the ready prefix."""

    def __init__(self, store: ResultStore) -> None:
        self.store = store
        self.pending: deque[Entry] = deque()

    def __len__(self) -> int:
        return len(self.pending)

    def add(self, entry: Entry) -> None:
        """Queue an entry behind the others."""
        self.pending.append(entry)

    def poll(self) -> list[Entry]:
        """Read what is missing at the front of the window; return the entries now in order."""
        missing: list[Entry] = []
        for entry in self.pending:
            if entry.payload is None:
                missing.append(entry)
                if len(missing) >= READ_BATCH:
                    break
        if missing:
            payloads = self.store.get_payloads([e.request_id for e in missing])
            for entry, payload in zip(missing, payloads, strict=True):
                entry.payload = payload
        return self.release()

    def release(self) -> list[Entry]:
        """Pop and return the ready entries at the front."""
        ready: list[Entry] = []
        while self.pending and self.pending[0].payload is not None:
            ready.append(self.pending.popleft())
        return ready
