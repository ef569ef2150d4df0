"""The state kept beside the queue, one seam per kind: choose once, never ask again.

Four kinds of state, each a protocol (``base.py``) with a Redis implementation
(the fleet's, and the embedded default's on its private server) and an in-memory
double for tests:

* ``GuardStore``: attempt counters, write claims and dead letters of the
  at-most-once guard, and whether the broker marks redeliveries;
* ``ResultStore``: finished ``SkillResult``s in Celery's own meta format;
* ``BatchLedger``: the ordered request ids of background batches;
* ``MetricStore``: invocation counters.

``open_stores(settings, backend)`` picks the implementations once, from Celery's
result backend; ``Stores.in_memory()`` gives the doubles for tests.
"""

from __future__ import annotations

from cleveragents.stores.base import (
    BatchLedger,
    Claim,
    GuardStore,
    MetricCounts,
    MetricStore,
    ResultStore,
    StartedMark,
)
from cleveragents.stores.factory import Stores, open_stores
from cleveragents.stores.memory import (
    MemoryBatchLedger,
    MemoryGuardStore,
    MemoryMetricStore,
    MemoryResultStore,
)
from cleveragents.stores.redis import (
    RedisBatchLedger,
    RedisGuardStore,
    RedisMetricStore,
    RedisResultStore,
)

__all__ = [
    "BatchLedger",
    "Claim",
    "GuardStore",
    "MemoryBatchLedger",
    "MemoryGuardStore",
    "MemoryMetricStore",
    "MemoryResultStore",
    "MetricCounts",
    "MetricStore",
    "RedisBatchLedger",
    "RedisGuardStore",
    "RedisMetricStore",
    "RedisResultStore",
    "ResultStore",
    "StartedMark",
    "Stores",
    "open_stores",
]
