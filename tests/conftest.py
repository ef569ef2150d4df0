"""Shared fixtures: a real Redis (failing, never skipping, when it is down), a real
RabbitMQ (a virtual host per test), and real workers."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from cleveragents.client import SkillClient
from cleveragents.embedded.urls import HomeUrls
from cleveragents.settings import Settings
from tests.support import rabbit
from tests.support.procs import EXAMPLE_SKILLS, FIXTURE_SKILLS, REPO, RedisServer, Worker
from tests.support.worker_runs import WorkerScenario

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


@pytest.fixture(scope="session")
def rabbitmq() -> Iterator[rabbit.Rabbit]:
    """This machine's RabbitMQ: skipped where it is not installed, except in CI (failed)."""
    problem = rabbit.missing()
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"{problem}; CI runs the RabbitMQ tests")
        pytest.skip(problem)
    if not rabbit.listening():
        pytest.fail(f"RabbitMQ is installed but not listening on {rabbit.HOST}:{rabbit.PORT}")
    server = rabbit.Rabbit()
    yield server
    server.close()


@pytest.fixture
def rabbit_url(rabbitmq: rabbit.Rabbit) -> Iterator[str]:
    """A fresh RabbitMQ virtual host for this test (deleted after it), as an AMQP URL."""
    with rabbitmq.vhost() as url:
        yield url


@dataclass(frozen=True)
class Broker:
    """Where a test's invocations travel (``url``) and where their results go (``backend``)."""

    kind: str  # "redis", "rabbitmq" or "embedded"
    #: The broker, and the Redis of the results: on the embedded default both are the
    #: home's server as redis-py names it, which no setting names (``env``).
    url: str
    backend: str
    #: The embedded default's home (its private server's), else None.
    home: str | None = None

    @property
    def env(self) -> dict[str, str]:
        """The settings of a producer or exporter on this broker."""
        if self.home is not None:
            # A command on the embedded home starts a local worker itself (submit --wait):
            # it serves the test catalogue too, as the test's own workers do.
            catalogue = os.pathsep.join([str(FIXTURE_SKILLS), str(EXAMPLE_SKILLS)])
            return {"CLEVERAGENTS_HOME": self.home, "CLEVERAGENTS_CATALOGUE": catalogue}
        return {"CLEVERAGENTS_BROKER_URL": self.url, "CLEVERAGENTS_RESULT_BACKEND": self.backend}

    def settings(self) -> Settings:
        return Settings.from_env(self.env)


@pytest.fixture(params=["redis", "rabbitmq"])
def broker(request: pytest.FixtureRequest, redis_url: str) -> Broker:
    """Each broker in turn: Redis alone, then RabbitMQ with the Redis as result backend.

    A module of queue tests adds the embedded default (no broker configured: the home's
    private server, which its workers and clients share) by overriding this fixture
    with ``params=EVERY_BROKER`` and the same body, ``broker_for``.
    """
    return broker_for(request, redis_url)


def broker_for(request: pytest.FixtureRequest, redis_url: str) -> Broker:
    """The ``Broker`` its parameter names."""
    if request.param == "redis":
        return Broker("redis", redis_url, redis_url)
    if request.param == "embedded":
        home = request.getfixturevalue("tmp_path") / "embedded-home"
        server = HomeUrls.of(home).client
        return Broker("embedded", server, server, home=str(home))
    return Broker("rabbitmq", request.getfixturevalue("rabbit_url"), redis_url)


#: Every broker a queue test runs on: ``broker``'s two, and the embedded default.
EVERY_BROKER = ["redis", "rabbitmq", "embedded"]


@pytest.fixture
def broker_client(broker: Broker) -> Iterator[SkillClient]:
    """A producer client on ``broker``."""
    with SkillClient(settings=broker.settings()) as producer:
        yield producer


def worker_env(
    broker: str, *, read_only: bool = False, backend: str | None = None, **extra: str
) -> dict[str, str]:
    """The environment of a test worker on ``broker`` with the test and example catalogues.

    Results go to ``backend``, by default the broker itself (a Redis).
    """
    env = {
        "CLEVERAGENTS_BROKER_URL": broker,
        "CLEVERAGENTS_RESULT_BACKEND": backend or broker,
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
        broker: str | Broker,
        *,
        read_only: bool = False,
        concurrency: int = 2,
        queues: str | None = None,
        extra: tuple[str, ...] = (),
        **env: str,
    ) -> Worker:
        url, backend = (broker, None) if isinstance(broker, str) else (broker.url, broker.backend)
        if isinstance(broker, Broker) and broker.home is not None:  # on the embedded home
            url, backend = "", None  # none configured
            env = {"CLEVERAGENTS_HOME": broker.home, **env}
        worker = Worker(
            worker_env(url, read_only=read_only, backend=backend, **env),
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
def scenario(
    broker: Broker,
    broker_client: SkillClient,
    start_worker: Callable[..., Worker],
    tmp_path: Path,
) -> WorkerScenario:
    """On each broker in turn: start a worker, submit, then read what happened
    (tests/support/worker_runs.py)."""
    return WorkerScenario(broker, broker_client, tmp_path, start_worker)


@pytest.fixture
def client(redis_url: str) -> Iterator[SkillClient]:
    """A producer client on the test Redis."""
    settings = Settings.from_env({"CLEVERAGENTS_BROKER_URL": redis_url})
    with SkillClient(settings=settings) as producer:
        yield producer


#: Test files that take a minute or more, or tens of seconds: collected first, so that
#: `pytest -n 2 --dist loadfile` (scripts/test) starts them while the other process
#: works through the many short files, instead of leaving one of them for the end.
SLOW_FILES = (
    "tests/faults/test_soak.py",
    "tests/faults/test_faults.py",
    "tests/faults/test_hostile_tools.py",
    "tests/faults/test_quiet_log.py",
    "tests/faults/test_frozen_worker.py",
    "tests/deploy/test_compose_commands.py",
    "tests/deploy/test_role_abuse.py",
    "tests/broker/test_recovery.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = str(item.path.relative_to(REPO)) if item.path.is_relative_to(REPO) else ""
        return SLOW_FILES.index(path) if path in SLOW_FILES else len(SLOW_FILES)

    items.sort(key=rank)  # stable: each file's tests keep their order
