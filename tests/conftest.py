"""Shared fixtures: a real Redis (failing, never skipping, when it is down) and real workers."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest
import redis

from cleveragents.client import SkillClient
from cleveragents.settings import Settings
from tests.procs import EXAMPLE_SKILLS, FIXTURE_SKILLS, RedisServer, Worker

#: Set to use an existing Redis (e.g. redis://127.0.0.1:6379/11) instead of a private one.
EXTERNAL_REDIS_URL = os.environ.get("CLEVERAGENTS_TEST_REDIS_URL")


@pytest.fixture(scope="session")
def session_redis_url() -> Iterator[str]:
    """A real Redis for the whole session: a private ``redis-server`` on a free port.

    Private, so that nothing else on the machine (another suite, a benchmark's
    worker) consumes the tests' queues or flushes their keys.
    """
    if EXTERNAL_REDIS_URL:
        yield EXTERNAL_REDIS_URL
        return
    server = RedisServer(persistence=False).start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(autouse=True)
def _no_ambient_config(monkeypatch: pytest.MonkeyPatch) -> None:
    # A developer's own CLEVERAGENTS_* settings must not leak into tests.
    for name in list(os.environ):
        if name.startswith("CLEVERAGENTS_"):
            monkeypatch.delenv(name, raising=False)


@pytest.fixture
def redis_url(session_redis_url: str) -> Iterator[str]:
    """The session's Redis, emptied before each test."""
    client = redis.Redis.from_url(session_redis_url)
    try:
        client.flushdb()
    except redis.ConnectionError as exc:  # fail loudly: CI must not skip queue tests
        pytest.fail(f"Redis at {session_redis_url} is not reachable: {exc}")
    yield session_redis_url
    client.close()


def worker_env(broker: str, *, read_only: bool = False, **extra: str) -> dict[str, str]:
    """The environment of a test worker on ``broker`` with the test and example catalogues."""
    env = {
        "CLEVERAGENTS_BROKER_URL": broker,
        "CLEVERAGENTS_RESULT_BACKEND": broker,
        "CLEVERAGENTS_CATALOGUE": os.pathsep.join([str(FIXTURE_SKILLS), str(EXAMPLE_SKILLS)]),
        "CLEVERAGENTS_READ_ONLY": "1" if read_only else "0",
    }
    env.update(extra)
    return env


@pytest.fixture
def start_worker() -> Iterator[Callable[..., Worker]]:
    """Start real worker processes; every one is killed by PID at the end of the test."""
    started: list[Worker] = []

    def start(
        broker: str,
        *,
        read_only: bool = False,
        concurrency: int = 2,
        queues: str | None = None,
        extra: tuple[str, ...] = (),
        **env: str,
    ) -> Worker:
        worker = Worker(
            worker_env(broker, read_only=read_only, **env),
            concurrency=concurrency,
            queues=queues,
            extra=extra,
        )
        started.append(worker)
        return worker.start()

    yield start
    for worker in started:
        worker.stop()


@pytest.fixture
def client(redis_url: str) -> Iterator[SkillClient]:
    """A producer client on the test Redis."""
    settings = Settings.from_env({"CLEVERAGENTS_BROKER_URL": redis_url})
    with SkillClient(settings=settings) as producer:
        yield producer
