"""A write that decides whether a write runs waits until a replica has it (``WAIT``).

Redis replicates asynchronously: a primary acknowledges a write before any replica
has it, and a failover (Sentinel promoting a replica) loses what had not reached
the replica yet. Among those writes are the ones that keep a write from running
twice: a write's claim, its recorded outcome, a request id's binding with its
``STARTED``, a person's decision; and those that keep nothing lost: a published
message, a stored result (``broker/redis/transport.py``,
``broker/redis/result_backend.py``). After each of those ``WAIT 1 <ms>`` goes on
the same connection, in the same round trip: the reply comes once one replica
has acknowledged everything that connection wrote, or after ``ms``.

It narrows the window, it does not close it (docs/guarantees.md states the
residual): a ``WAIT`` that times out (no replica, a slow one) lets the write go on,
said in a warning at most once a minute; and a replica that acknowledged may still
not be the one promoted, when there are several. ``CLEVERAGENTS_REPLICA_WAIT_MS``
sets ``ms`` (``Settings.replica_wait_ms``: 100 on a ``sentinel://`` fleet, else 0,
off); ``benchmarks/replica_wait.py`` measures what it costs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ResponseError

__all__ = ["WARN_EVERY_S", "ReplicaWait"]

log = logging.getLogger("cleveragents.stores.replication")

#: A write no replica acknowledged in time is said at most this often per process.
WARN_EVERY_S = 60.0


@dataclass
class ReplicaWait:
    """``WAIT replicas timeout_ms`` after a decisive write (``timeout_ms`` 0: none)."""

    timeout_ms: int = 0
    replicas: int = 1
    _warned_at: float = field(default=float("-inf"), repr=False)

    @property
    def commands(self) -> list[tuple[Any, ...]]:
        """What to send after the decisive write, on its connection (none when off)."""
        if self.timeout_ms <= 0:
            return []
        return [("WAIT", self.replicas, self.timeout_ms)]

    def check(self, replies: Sequence[Any]) -> None:
        """Read the ``WAIT`` reply among ``replies`` (those of ``commands``): warn when no
        replica acknowledged in time; turn it off when Redis refuses it."""
        if not replies:
            return
        reply = replies[0]
        if isinstance(reply, ResponseError):
            self.timeout_ms = 0
            log.warning("Redis refused WAIT (%s): decisive writes no longer wait", reply)
            return
        now = time.monotonic()
        if int(reply) >= self.replicas or now - self._warned_at < WARN_EVERY_S:
            return
        self._warned_at = now
        log.warning(
            "no replica acknowledged a write claim, binding or decision within %d ms: a "
            "failover now could lose it (CLEVERAGENTS_REPLICA_WAIT_MS, docs/guarantees.md)",
            self.timeout_ms,
        )
