"""The scenario the queue tests share: start a worker, submit, then read what happened.

``WorkerScenario`` (the ``scenario`` fixture of tests/conftest.py) holds one test's
broker, a producer client on it, its folder and a way to start workers there. What
happened is read from three places: the JSON-lines file a fixture tool appends one
row a run to (``runs``, ``run_keys``), the workers' own logs (``deliveries``,
``answered``), and the broker (``quiet``). ``wait_settled`` waits until nothing of a
request is left to happen: the event a test that asserts "it did not run again" waits
for, instead of a fixed sleep. ``cli`` is the same scenario from a shell: the
``cleveragents`` command on a test's broker, with no setting of the test process's own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis

from cleveragents.client import SkillClient
from cleveragents.constants import HELD_KEY, QUEUE_BATCH, QUEUE_BATCH_WRITE, QUEUE_READ, QUEUE_WRITE
from tests.support.procs import REPO, Worker, wait_until
from tests.support.rabbit import queue_state

if TYPE_CHECKING:  # tests/conftest.py's fixture imports this module
    from tests.conftest import Broker

__all__ = [
    "SKILL_QUEUES",
    "WorkerScenario",
    "answered",
    "answered_in",
    "clean_env",
    "cli",
    "deliveries",
    "quiet",
    "received_in",
    "run_keys",
    "runs",
    "wait_settled",
]

#: The queues invocations travel in (the dead-letter queue is not one of them).
SKILL_QUEUES = (QUEUE_READ, QUEUE_WRITE, QUEUE_BATCH, QUEUE_BATCH_WRITE)


@dataclass(frozen=True)
class WorkerScenario:
    """One test's broker, a producer ``client`` on it, its ``folder``, and its workers."""

    broker: Broker
    client: SkillClient
    folder: Path
    starter: Callable[..., Worker]  # tests/conftest.py's start_worker

    def start_worker(self, **options: Any) -> Worker:
        """A real worker on this broker (``start_worker``'s options); killed after the test."""
        return self.starter(self.broker, **options)


def runs(log: Path, key: str | None = None) -> list[dict[str, Any]]:
    """The rows a fixture tool appended to ``log``, one a run (those of ``key`` only)."""
    if not log.exists():
        return []
    rows = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    return [row for row in rows if key is None or row["key"] == key]


def run_keys(log: Path) -> list[str]:
    """The ``key`` of each run in ``log``, in the order they ran."""
    return [row["key"] for row in runs(log)]


def received_in(log: str, request_id: str) -> int:
    """How many times the worker whose log this is received ``skills.invoke`` for
    ``request_id``."""
    return log.count(f"Task skills.invoke[{request_id}] received")


def answered_in(log: str, request_id: str) -> int:
    """How many deliveries of ``request_id`` the worker whose log this is is done with:
    each logs one line (``succeeded``, ``ignored``, ``raised``...) after its result is
    stored."""
    return log.count(f"Task skills.invoke[{request_id}] ") - received_in(log, request_id)


def deliveries(workers: Iterable[Worker], request_id: str) -> int:
    """How many times the workers received ``skills.invoke`` for ``request_id`` (their logs)."""
    return sum(received_in(worker.log_text(), request_id) for worker in workers)


def answered(workers: Iterable[Worker], request_id: str) -> int:
    """How many deliveries of ``request_id`` the workers are done with (their logs)."""
    return sum(answered_in(worker.log_text(), request_id) for worker in workers)


def quiet(broker: str, results: str) -> bool:
    """True when no message waits in a skill queue and, on Redis, none is handed out.

    ``broker`` is a Redis or an AMQP URL; ``results`` the Redis beside it. On Redis a
    message handed out and not acknowledged is one a sweep or the reaper could hand out
    again; on RabbitMQ such a message is one a worker has received (its log says so),
    and it comes back only if that worker's channel closes.
    """
    try:
        if not broker.startswith(("redis", "unix")):
            return sum(queue_state(broker, q)[0] for q in SKILL_QUEUES) == 0
        with redis.Redis.from_url(results, socket_timeout=5) as client:
            waiting = sum(int(client.llen(q)) for q in SKILL_QUEUES)
            handed_out = int(client.hlen("unacked")) + int(client.hlen(HELD_KEY))
    except Exception:  # Redis down, RabbitMQ busy: not known to be quiet
        return False
    return waiting == 0 and handed_out == 0


def wait_settled(
    workers: Iterable[Worker], broker: Broker, request_id: str, timeout: float = 30
) -> None:
    """Wait until nothing of ``request_id`` is left to happen: every delivery the workers
    received is answered, and nothing waits in a queue or is handed out."""
    chosen = list(workers)
    wait_until(
        lambda: answered(chosen, request_id) == deliveries(chosen, request_id)
        and quiet(broker.url, broker.backend),
        timeout,
        f"every delivery of {request_id} answered",
    )


def clean_env() -> dict[str, str]:
    """This process's environment without its ``CLEVERAGENTS_*`` settings."""
    return {k: v for k, v in os.environ.items() if not k.startswith("CLEVERAGENTS_")}


def cli(broker: Broker, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``cleveragents ARGS`` on ``broker``, run from the checkout; never raises on its code."""
    return subprocess.run(
        [sys.executable, "-m", "cleveragents", *args],
        env={**clean_env(), **broker.env, "PYTHONPATH": str(REPO)}, cwd=REPO,
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
