"""A write claim, a write's outcome, a published message and a stored result are on the
replica before the call returns (``WAIT``, stores/replication.py): a failover right
after cannot lose them.

A private primary and its replica; the replica is frozen (SIGSTOP) for a moment
while the claim is taken, so that without the wait the claim would return long
before the replica has it.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from cleveragents.broker.celery_settings import celery_settings
from cleveragents.broker.redis.result_backend import worker_result_backend
from cleveragents.client import SkillClient
from cleveragents.constants import QUEUE_READ
from cleveragents.settings import Settings
from cleveragents.stores.base import Claim
from cleveragents.stores.redis import RedisGuardStore
from cleveragents.stores.replication import ReplicaWait
from tests.support.sentinel import SentinelFleet, sentinel_fleet

pytestmark = pytest.mark.timeout(60)

#: How long the replica is frozen while a decisive write is made.
FROZEN_S = 0.5


@pytest.fixture
def pair() -> Iterator[SentinelFleet]:
    with sentinel_fleet(sentinels=0) as made:
        yield made


def _frozen_replica(fleet: SentinelFleet) -> threading.Timer:
    """Freeze the replica now; it runs again ``FROZEN_S`` later."""
    pid = fleet.procs["replica"].pid
    os.kill(pid, signal.SIGSTOP)
    timer = threading.Timer(FROZEN_S, os.kill, (pid, signal.SIGCONT))
    timer.start()
    return timer


@pytest.mark.parametrize(
    "write",
    [
        lambda store, rid: store.claim(rid, Claim.mine(60)),
        lambda store, rid: store.finish(rid, {"success": True}),
    ],
    ids=["claim", "outcome"],
)
def test_a_decisive_write_returns_once_the_replica_has_it(pair: SentinelFleet, write: Any) -> None:
    # Given a guard store on the primary that waits up to 5 s for one replica
    primary = redis.Redis(port=pair.ports["primary"], socket_timeout=10)
    replica = redis.Redis(port=pair.ports["replica"], socket_timeout=10)
    store = RedisGuardStore(primary, ttl_s=600, replicas=ReplicaWait(5000))
    # When the write is made while the replica is frozen
    timer = _frozen_replica(pair)
    started = time.monotonic()
    write(store, "req-1")
    took = time.monotonic() - started
    timer.join()
    # Then it returned only once the replica ran again and had it
    assert took >= FROZEN_S * 0.8, took
    assert replica.exists("cleveragents:claim:write:req-1")


def _settings(pair: SentinelFleet, tmp: Path) -> Settings:
    url = f"redis://127.0.0.1:{pair.ports['primary']}/0"
    return Settings.from_env(
        {
            "CLEVERAGENTS_BROKER_URL": url,
            "CLEVERAGENTS_HOME": str(tmp),
            "CLEVERAGENTS_REPLICA_WAIT_MS": "5000",
        }
    )


def test_a_message_is_on_the_replica_before_its_publish_returns(
    pair: SentinelFleet, tmp_path: Path
) -> None:
    # Given a producer whose publishes wait up to 5 s for a replica
    client = SkillClient(settings=_settings(pair, tmp_path))
    replica = redis.Redis(port=pair.ports["replica"], socket_timeout=10)
    request = client.build_request("test/faults", "test/read", {"path": "x", "key": "k"})
    # When it sends while the replica is frozen
    timer = _frozen_replica(pair)
    started = time.monotonic()
    client.submit(request)
    took = time.monotonic() - started
    timer.join()
    client.close()
    # Then the send returned only once the replica had the message
    assert took >= FROZEN_S * 0.8, took
    assert replica.llen(QUEUE_READ) == 1


def test_a_stored_result_is_on_the_replica_before_the_store_returns(
    pair: SentinelFleet, tmp_path: Path
) -> None:
    # Given a worker's result backend that waits up to 5 s for a replica
    app = Celery(set_as_current=False)
    app.conf.update(celery_settings(_settings(pair, tmp_path)))
    backend = worker_result_backend(str(app.conf["result_backend"]))
    assert backend is not None
    app.conf["result_backend"] = backend
    replica = redis.Redis(port=pair.ports["replica"], socket_timeout=10)
    # When a result is stored while the replica is frozen
    timer = _frozen_replica(pair)
    started = time.monotonic()
    app.backend.store_result("req-2", {"ok": True}, "SUCCESS")
    took = time.monotonic() - started
    timer.join()
    # Then the store returned only once the replica had it
    assert took >= FROZEN_S * 0.8, took
    assert replica.exists("celery-task-meta-req-2")


def test_a_sentinel_fleet_waits_for_a_replica_by_default_and_others_do_not() -> None:
    sentinel = Settings.from_env({"CLEVERAGENTS_BROKER_URL": "sentinel://127.0.0.1:26379"})
    plain = Settings.from_env({"CLEVERAGENTS_BROKER_URL": "redis://127.0.0.1:6379/0"})
    given = Settings.from_env(
        {"CLEVERAGENTS_BROKER_URL": "redis://h:6379/0", "CLEVERAGENTS_REPLICA_WAIT_MS": "20"}
    )
    assert (sentinel.replica_wait_ms, plain.replica_wait_ms, given.replica_wait_ms) == (100, 0, 20)
    assert ReplicaWait(0).commands == []
