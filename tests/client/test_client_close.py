"""A closed client holds no result connection, and a client that waits in vain says why."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from cleveragents.client import NoWorkerRunning, SkillClient
from cleveragents.embedded.runner import LocalWorker
from cleveragents.settings import Settings
from tests.support.procs import RedisServer, wait_until


def _clients(server: redis.Redis, name: str) -> int:
    return sum(1 for c in server.client_list() if c.get("name", "") != name)


@pytest.fixture
def private_redis_url() -> Iterator[str]:
    """A Redis of this test's own: no other test's client or worker is connected to it."""
    server = RedisServer(persistence=False).start()
    try:
        yield server.url
    finally:
        server.stop()


def test_close_releases_the_result_connections_of_the_client(private_redis_url: str) -> None:
    # Given the connections to Redis before any client exists (no worker: nothing else connects)
    redis_url = private_redis_url
    server = redis.Redis.from_url(redis_url)
    server.client_setname("observer")
    before = _clients(server, "observer")

    # And a client that sent an invocation (its broker connection goes to kombu's shared
    # pool, for the next client), looked for its result and waited on it briefly
    settings = Settings.from_env({"CLEVERAGENTS_BROKER_URL": redis_url})
    client = SkillClient(settings=settings)
    job = client.submit("local/text-tools", "local/word-count", {"text": "a b"})
    sent = _clients(server, "observer")
    assert not job.ready()
    with pytest.raises(TimeoutError):
        job.result(timeout=0.2)
    assert _clients(server, "observer") > sent >= before, (before, sent)

    # When it is closed, while it is still referenced
    client.close()

    # Then Redis sees none of its result connections any more (Redis notices a closed
    # socket on its next turn: on a busy machine, a moment later)
    wait_until(lambda: _clients(server, "observer") <= sent, 5, "the connections to close")
    server.close()


def test_a_time_out_on_the_embedded_default_names_the_id_and_how_to_start_a_worker(
    tmp_path: Path,
) -> None:
    # Given a client on the embedded default, and no worker running
    settings = Settings.from_env({"CLEVERAGENTS_HOME": str(tmp_path / "home")})
    with SkillClient(settings=settings) as client:
        handle = client.submit("local/text-tools", "local/word-count", {"text": "a"})
        # When its wait runs out
        with pytest.raises(TimeoutError) as raised:
            handle.result(timeout=0.3)
    # Then the error names the request and says how to get a worker
    assert handle.request_id in str(raised.value)
    assert "cleveragents worker" in str(raised.value)
    assert "LocalWorker" in str(raised.value)


def test_a_wait_on_the_embedded_default_with_no_worker_says_so_within_seconds(
    tmp_path: Path,
) -> None:
    # Given a client on the embedded default, and no worker running
    settings = Settings.from_env({"CLEVERAGENTS_HOME": str(tmp_path / "home")})
    with SkillClient(settings=settings) as client:
        handle = client.submit("local/text-tools", "local/word-count", {"text": "a"})
        started = time.monotonic()
        # When it waits with a long time-out
        with pytest.raises(NoWorkerRunning) as raised:
            handle.result(timeout=60)
    # Then it is told at once that nothing serves the queue, and how to start a worker
    assert time.monotonic() - started < 15
    assert "no worker serves the embedded queue" in str(raised.value)
    assert "cleveragents worker" in str(raised.value)
    assert isinstance(raised.value, TimeoutError)


def test_a_wait_on_the_embedded_default_with_a_local_worker_gets_its_result(
    tmp_path: Path,
) -> None:
    settings = Settings.from_env({"CLEVERAGENTS_HOME": str(tmp_path / "home")})
    with SkillClient(settings=settings) as client, LocalWorker(settings):
        result = client.submit("local/text-tools", "local/word-count", {"text": "a b"}).result(
            timeout=60
        )
    assert result.output_data == {"words": 2}
