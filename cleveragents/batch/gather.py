"""Collect results in input order with bulk reads, holding only a bounded window in memory."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from cleveragents.stores import ResultStore
from cleveragents.stores.result_meta import refused_for_writes

__all__ = ["Entry", "OrderedGather"]

#: At most this many ids are asked for in one bulk read.
READ_BATCH = 2000
#: Ids past the front that one look ahead reads (``OrderedGather.look_ahead``).
LOOK_AHEAD = 500
#: The fewest ids a bulk read asks for: it asks for twice what the last one found, and
#: twice as many as last time when everything it asked for was there.
FIRST_READ = 64


@dataclass
class Entry:
    """One request of a batch, waiting for (or holding) its stored payload."""

    line: int
    request_id: str
    skill: str = ""
    tool: str = ""
    payload: dict[str, Any] | None = field(default=None)
    #: Sent with writes allowed: a stored refusal for want of writes is an earlier run's,
    #: read past until the worker replaces it.
    writes: bool = False


class OrderedGather:
    """Entries in input order; ``poll`` fetches missing payloads and releases the ready prefix."""

    def __init__(self, store: ResultStore) -> None:
        self.store = store
        self.pending: deque[Entry] = deque()
        #: How many missing ids the next bulk read asks for (``FIRST_READ``): a read
        #: of ids whose results are not there yet costs the producer and Redis for
        #: nothing, and the front of the window is often still running.
        self.want = FIRST_READ
        self._ahead_at = 0  # where the next look ahead starts, among the missing past the front

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
                if len(missing) >= self.want:
                    break
        if missing:
            payloads = self.store.get_payloads([e.request_id for e in missing])
            found = 0
            for entry, payload in zip(missing, payloads, strict=True):
                if entry.writes and payload is not None and refused_for_writes(payload):
                    payload = None
                entry.payload = payload
                found += payload is not None
            wanted = 2 * len(missing) if found == len(missing) else 2 * found
            self.want = max(FIRST_READ, min(READ_BATCH, wanted))
        return self.release()

    def look_ahead(self, limit: int = LOOK_AHEAD) -> int:
        """Read up to ``limit`` missing payloads past the front, the next slice each call
        (round robin over the window); return how many were found.

        Lines finish in any order: a slow line at the front holds every later one back
        from the output, and a progress bar that counted only what is written would
        stand still while the workers get through thousands. A payload found here is
        kept (it is written when its turn comes), so the read is not wasted.
        """
        missing = [e for e in self.pending if e.payload is None]
        if len(missing) <= self.want:  # poll reads these anyway
            return 0
        behind = missing[self.want :]
        start = self._ahead_at % len(behind)
        chosen = (behind[start:] + behind[:start])[:limit]
        self._ahead_at = start + len(chosen)
        payloads = self.store.get_payloads([e.request_id for e in chosen])
        found = 0
        for entry, payload in zip(chosen, payloads, strict=True):
            if payload is None or (entry.writes and refused_for_writes(payload)):
                continue
            entry.payload = payload
            found += 1
        return found

    def held(self) -> int:
        """Entries in the window that hold their payload (finished, not yet released)."""
        return sum(1 for e in self.pending if e.payload is not None)

    def release(self) -> list[Entry]:
        """Pop and return the ready entries at the front."""
        ready: list[Entry] = []
        while self.pending and self.pending[0].payload is not None:
            ready.append(self.pending.popleft())
        return ready
