"""The one place that opens the stores: Redis, beside the Redis result backend."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import redis

from cleveragents.constants import AUDIT_KEY, READ_ONLY_AUDIT_KEY
from cleveragents.errors import ConfigurationError
from cleveragents.settings import Settings
from cleveragents.stores.approvals import ApprovalStore, MemoryApprovalStore
from cleveragents.stores.approvals_redis import (
    FLEETS,
    READ_ONLY_FLEET,
    WRITE_FLEET,
    RedisApprovalStore,
)
from cleveragents.stores.audit import (
    AuditLog,
    MemoryAuditLog,
    RedisAuditLog,
    SealedAuditLog,
)
from cleveragents.stores.audit_chain import AuditSealer
from cleveragents.stores.base import BatchLedger, GuardStore, MetricStore, ResultStore
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
from cleveragents.stores.redis_sockets import harden
from cleveragents.stores.replication import ReplicaWait

__all__ = ["Stores", "audit_secret", "open_stores"]

#: Broker URL schemes whose kombu transport marks a redelivered message (Redis, AMQP;
#: the embedded default's server is a Redis). Elsewhere the guard counts every delivery.
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

    Keys in the result backend's Redis (the embedded default's server is one), through
    the backend's own client: one connection pool.

    Raises:
        ConfigurationError: the result backend is not a Redis.
    """
    client = getattr(backend, "client", None)
    if not isinstance(client, redis.Redis):
        raise ConfigurationError(
            "CLEVERAGENTS_RESULT_BACKEND must be a Redis (redis://, rediss://, unix:// or "
            "sentinel://): the guard, batches, approvals and the audit trail are kept "
            "beside the results"
        )
    harden(client)  # a lost Redis host's half-open links dropped within seconds
    expires = int(getattr(backend, "expires", 0) or 0) or None
    scheme = (settings.broker_url or "").partition("://")[0].lower()
    marks = settings.embedded or scheme in MARKING_SCHEMES
    return Stores(
        guard=RedisGuardStore(
            client,
            ttl_s=settings.result_expires_s,
            marks_redeliveries=marks,
            scripted=worker,
            replicas=ReplicaWait(settings.replica_wait_ms),
        ),
        results=RedisResultStore(client, backend.get_key_for_task, expires),
        ledger=RedisBatchLedger(client, expires),
        metrics=RedisMetricStore(client),
        approvals=RedisApprovalStore(
            client,
            settings.result_expires_s,
            _fleets(settings, worker),
            ReplicaWait(settings.replica_wait_ms),
        ),
        audit=_sealed(settings, worker, RedisAuditLog(client, *_streams(settings, worker))),
    )


def _fleets(settings: Settings, worker: bool) -> tuple[Any, ...]:
    """The approval keys a process reads: a worker its own fleet's (a read-only worker's
    user may not touch a write worker's), everyone else both."""
    if not worker:
        return FLEETS
    return (READ_ONLY_FLEET,) if settings.read_only else (WRITE_FLEET,)


def _streams(settings: Settings, worker: bool) -> tuple[int, tuple[str, ...]]:
    """The audit streams a process uses: a worker appends to its fleet's own, everyone
    else reads both."""
    if not worker:
        return settings.audit_maxlen, (AUDIT_KEY, READ_ONLY_AUDIT_KEY)
    return settings.audit_maxlen, ((READ_ONLY_AUDIT_KEY,) if settings.read_only else (AUDIT_KEY,))


def _sealed(settings: Settings, worker: bool, log: AuditLog) -> AuditLog:
    """A worker's trail seals what it appends; a reader's reads as it is."""
    return SealedAuditLog(log, AuditSealer(audit_secret(settings))) if worker else log


def audit_secret(settings: Settings) -> str | None:
    """The key the audit trail is sealed and checked with: ``CLEVERAGENTS_AUDIT_KEY``,
    else on the embedded default one made once in the home (``audit.key``, 0600), else
    none (the chain is kept without a key)."""
    if settings.audit_key:
        return settings.audit_key
    if not settings.embedded:
        return None
    path = settings.home.resolve() / "audit.key"
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except FileNotFoundError:
        pass
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process made it first
        return path.read_text(encoding="utf-8").strip() or None
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(os.urandom(32).hex())
    return path.read_text(encoding="utf-8").strip()
