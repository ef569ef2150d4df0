"""The one place that chooses the stores: Redis beside a Redis result backend, else files."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

from cleveragents.settings import Settings
from cleveragents.stores.approvals import ApprovalStore, FileApprovalStore, MemoryApprovalStore
from cleveragents.stores.approvals_redis import RedisApprovalStore
from cleveragents.stores.audit import AuditLog, FileAuditLog, MemoryAuditLog, RedisAuditLog
from cleveragents.stores.base import BatchLedger, GuardStore, MetricStore, ResultStore
from cleveragents.stores.files import (
    FileBatchLedger,
    FileGuardStore,
    FileResultStore,
    NullMetricStore,
)
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

__all__ = ["Stores", "open_stores"]

#: Broker URL schemes whose kombu transport marks a redelivered message (Redis, AMQP).
#: Elsewhere (the embedded file transport) the guard counts every delivery instead.
MARKING_SCHEMES = frozenset({"redis", "rediss", "unix", "sentinel", "amqp", "amqps", "pyamqp"})


@dataclass(frozen=True)
class Stores:
    """Every store of one deployment, chosen together."""

    guard: GuardStore
    results: ResultStore
    ledger: BatchLedger
    metrics: MetricStore
    approvals: ApprovalStore
    audit: AuditLog

    @classmethod
    def in_memory(cls, *, marks_redeliveries: bool = True) -> Stores:
        """Fresh in-memory stores (``marks_redeliveries``: stand in for Redis, or not)."""
        return cls(
            guard=MemoryGuardStore(marks_redeliveries=marks_redeliveries),
            results=MemoryResultStore(),
            ledger=MemoryBatchLedger(),
            metrics=MemoryMetricStore(),
            approvals=MemoryApprovalStore(),
            audit=MemoryAuditLog(),
        )


def open_stores(settings: Settings, backend: Any, *, worker: bool = False) -> Stores:
    """The stores beside Celery's result ``backend`` (``worker``: a worker's, which may
    run scripts: many ids bound at once, a first delivery's binding with its ``STARTED``).

    With the Redis result backend: keys in that Redis, through the backend's own
    client (one connection pool). With any other (the embedded default's file
    store): files under ``settings.home``, and results in the backend itself.
    Whether redeliveries are marked is the broker's to say (``MARKING_SCHEMES``).
    """
    client = getattr(backend, "client", None)
    expires = int(getattr(backend, "expires", 0) or 0) or None
    marks = (settings.broker_url or "").partition("://")[0].lower() in MARKING_SCHEMES
    if isinstance(client, redis.Redis):
        return Stores(
            guard=RedisGuardStore(
                client, ttl_s=settings.result_expires_s, marks_redeliveries=marks, scripted=worker
            ),
            results=RedisResultStore(client, backend.get_key_for_task, expires),
            ledger=RedisBatchLedger(client, expires),
            metrics=RedisMetricStore(client),
            approvals=RedisApprovalStore(client, settings.result_expires_s),
            audit=RedisAuditLog(client, settings.audit_maxlen),
        )
    home = settings.home.resolve()
    return Stores(
        guard=FileGuardStore(home / "guard", marks_redeliveries=marks),
        results=FileResultStore(backend),
        ledger=FileBatchLedger(home / "batches"),
        metrics=NullMetricStore(),
        approvals=FileApprovalStore(home / "approvals"),
        audit=FileAuditLog(home / "audit.jsonl", settings.audit_maxlen),
    )
