"""A connection left waiting on a primary that stopped answering (its host lost: no FIN,
no RST) moves to the new primary as soon as the Sentinels name it, not when a time-out
finds it dead (``cleveragents/broker/redis/sentinel_follow.py``).

A private primary, replica and three Sentinels on loopback (``tests/support/sentinel.py``);
the primary is frozen with SIGSTOP, which its peers see as a lost host does: the kernel
keeps the connections, nothing answers on them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from cleveragents.broker.redis.sentinel import sentinel_client
from cleveragents.broker.redis.sentinel_follow import SENTINEL_TIMEOUT_S, WATCH_S, _watcher
from cleveragents.client import SkillClient
from cleveragents.settings import Settings
from tests.conftest import worker_env
from tests.support.procs import Worker, wait_until
from tests.support.sentinel import MASTER, SentinelFleet, sentinel_fleet

pytestmark = pytest.mark.timeout(120)

#: A socket time-out far over the bound asserted: only the watcher can end the wait sooner.
SOCKET_TIMEOUT_S = 40.0
#: Slack over the bound, for a machine of 2 busy cores.
SLACK_S = 3.0
#: CLEVERAGENTS_RECOVERY_S of the test's worker and producer.
RECOVERY_S = 4.0


@pytest.fixture
def fleet() -> Iterator[SentinelFleet]:
    with sentinel_fleet() as made:
        yield made


def test_a_command_waiting_on_a_frozen_primary_ends_and_the_next_reaches_the_new_one(
    fleet: SentinelFleet,
) -> None:
    # Given a client on the Sentinels with a connection open to the primary
    client = sentinel_client(fleet.url, MASTER, socket_timeout=SOCKET_TIMEOUT_S)
    # When the primary stops answering while a command waits on it
    after_s, outcome, old = _get_across_a_freeze(fleet, client)
    # Then the wait ended as a dropped connection does, within a watch's pace and a
    # Sentinel's time-out of the failover (far under the socket's time-out), and the
    # client's next command is answered by the new primary
    assert isinstance(outcome, redis.ConnectionError), outcome
    assert after_s < WATCH_S + SENTINEL_TIMEOUT_S + SLACK_S
    assert client.get("greeting") == b"hello"
    assert int(client.info("server")["tcp_port"]) == fleet.primary_port() != old


def test_a_command_retried_after_the_cut_is_answered_by_the_new_primary(
    fleet: SentinelFleet,
) -> None:
    # Given a client that retries a command once its connection drops (as kombu's and
    # the stores' do), with a connection open to the primary
    client = sentinel_client(fleet.url, MASTER, socket_timeout=SOCKET_TIMEOUT_S,
                             retry=Retry(NoBackoff(), 3), retry_on_error=[redis.ConnectionError])
    # When the primary stops answering while a command waits on it
    after_s, outcome, _ = _get_across_a_freeze(fleet, client)
    # Then its retry reconnected where the Sentinels say the primary is now (redis-py's
    # retry reconnects to the address the connection had), and was answered there
    assert outcome == b"hello"
    assert after_s < WATCH_S + SENTINEL_TIMEOUT_S + SLACK_S


def _get_across_a_freeze(fleet: SentinelFleet, client: redis.Redis) -> tuple[float, object, int]:
    """A GET sent as the primary freezes: when it ended after the failover, with what,
    and the frozen primary's port."""
    client.set("greeting", "hello")
    fleet.primary().wait(1, 5000)  # on the replica too
    ended: list[tuple[float, object]] = []
    waiting = threading.Thread(target=_get, args=(client, ended), daemon=True)
    old = fleet.freeze_primary()
    waiting.start()
    failover = fleet.wait_failover(old, timeout=30)
    waiting.join(SOCKET_TIMEOUT_S + 5)
    [(at, outcome)] = ended
    return at - failover, outcome, old


def test_the_watch_leaves_the_connections_to_the_primary_alone(fleet: SentinelFleet) -> None:
    # Given a client with a connection to the primary, and no failover
    client = sentinel_client(fleet.url, MASTER, socket_timeout=5)
    connection_id = client.client_id()
    # When the process's watcher has had three answers from the Sentinels
    watcher = _watcher(client.connection_pool)
    answered = watcher.answers
    wait_until(lambda: watcher.answers >= answered + 3, 10 * WATCH_S, "three answers")
    # Then the same connection serves: none was cut
    assert client.client_id() == connection_id


def _get(client: redis.Redis, ended: list[tuple[float, object]]) -> None:
    try:
        outcome: object = client.get("greeting")
    except redis.RedisError as exc:
        outcome = exc
    ended.append((time.monotonic(), outcome))


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_a_fleet_serves_again_within_the_recovery_time_of_the_failover(
    tls: bool, tmp_path: Path
) -> None:
    with sentinel_fleet(tls=tls) as fleet:
        _serves_across_a_freeze(fleet, tmp_path)


def _serves_across_a_freeze(fleet: SentinelFleet, tmp_path: Path) -> None:
    # Given a worker and a producer on sentinel:// URLs that have served, with their
    # connections open to the primary (over TLS only, with ``tls``: the servers and
    # Sentinels have no plain port, and the URLs name the CA)
    env: dict[str, str] = {"CLEVERAGENTS_HOME": str(tmp_path / "home"),
                           "CLEVERAGENTS_RECOVERY_S": "4"}
    worker = Worker({**worker_env(fleet.url), **env}, concurrency=2).start()
    try:
        client = SkillClient(settings=Settings.from_env(
            {**env, "CLEVERAGENTS_BROKER_URL": fleet.url, "CLEVERAGENTS_RESULT_BACKEND": fleet.url}
        ))
        for _ in range(3):
            assert client.submit("local/text-tools", "local/word-count",
                                 {"text": "a b"}).result(timeout=30).success
        # When the primary stops answering, and a read is sent at once
        old = fleet.freeze_primary()
        served: list[float] = []
        read = threading.Thread(target=_read, args=(client, served), daemon=True)
        read.start()
        failover = fleet.wait_failover(old, timeout=30)
        read.join(90)
    finally:
        worker.stop()
        log = worker.log_text()
    # Then it was served within a watch's pace, a Sentinel's time-out and the recovery
    # time of the failover, with no manual step
    assert served, log[-3000:]
    print(f"served {served[0] - failover:.1f} s after the failover")
    assert served[0] - failover < WATCH_S + SENTINEL_TIMEOUT_S + RECOVERY_S + SLACK_S, log[-3000:]


def _read(client: SkillClient, served: list[float]) -> None:
    handle = client.submit("local/text-tools", "local/word-count", {"text": "x"})
    if handle.result(timeout=80).success:
        served.append(time.monotonic())
