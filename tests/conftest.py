"""Shared fixtures: a real Redis (failing, never skipping, when it is down) and real workers."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest
import redis

from cleveragents.client import SkillClient
from cleveragents.settings import Settings
from tests.procs import EXAMPLE_SKILLS, FIXTURE_SKILLS, Worker

#: The Redis every queue test uses: the machine's, on a database of its own.
REDIS_URL = os.environ.get("CLEVERAGENTS_TEST_REDIS_URL", "redis://127.0.0.1:6379/11")


@pytest.fixture(autouse=True)
def _no_ambient_config(monkeypatch: pytest.MonkeyPatch) -> None:
    # A developer's own CLEVERAGENTS_* settings must not leak into tests.
    for name in list(os.environ):
        if name.startswith("CLEVERAGENTS_"):
            monkeypatch.delenv(name, raising=False)


@pytest.fixture
def redis_url() -> Iterator[str]:
    """The test database of the machine's Redis, emptied before each test."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.flushdb()
    except redis.ConnectionError as exc:  # fail loudly: CI must not skip queue tests
        pytest.fail(f"Redis at {REDIS_URL} is not reachable: {exc}")
    yield REDIS_URL
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
