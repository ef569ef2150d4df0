"""Fleet-wide limits a tool declares (``limits:``), through real workers.

An invocation over its limit goes back to the broker to wait: no pool process waits
for it, so other tools run at full speed beside it; a slot held by a worker killed
with ``kill -9`` comes back within the recovery time.
"""

from __future__ import annotations

import contextlib
import itertools
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from cleveragents.client import SkillClient
from cleveragents.metrics.exporter import render
from tests.conftest import EVERY_BROKER, Broker, broker_for
from tests.support.procs import Worker, kill_group, wait_until
from tests.support.worker_runs import WorkerScenario, runs

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(params=EVERY_BROKER)
def broker(request: pytest.FixtureRequest, redis_url: str) -> Broker:
    """Redis, RabbitMQ, and the embedded default (issue 44: the fleet's queue tests)."""
    return broker_for(request, redis_url)


def test_one_at_a_time_never_runs_twice_at_once_and_other_tools_run_beside_it(
    scenario: WorkerScenario,
) -> None:
    scenario.start_worker(concurrency=2)
    limited_log, quick_log = scenario.folder / "limited.jsonl", scenario.folder / "quick.jsonl"
    # Given 4 runs of a tool limited to one at a time, 1 s each
    limited = [
        scenario.client.submit("test/limits", "test/one-at-a-time",
                             {"log": str(limited_log), "key": f"l{n}", "seconds": 1})
        for n in range(4)
    ]  # fmt: skip
    wait_until(lambda: scenario.client.state(limited[0].request_id) == "STARTED", 30, "the first")
    # When 10 quick reads of another tool are sent meanwhile
    sent = time.monotonic()
    quick = [
        scenario.client.submit("test/limits", "test/quick", {"log": str(quick_log), "key": f"q{n}"})
        for n in range(10)
    ]
    # Then they finish within 3 s: no pool process waits for the limited tool
    for handle in quick:
        assert handle.result(timeout=30).success
    assert time.monotonic() - sent < 3.0
    for handle in limited:
        assert handle.result(timeout=60).success
    # And the limited tool never ran twice at once (measured by the tool itself)
    spans = sorted((row["start"], row["end"]) for row in runs(limited_log))
    assert len(spans) == 4
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end - 0.01, spans
    # And the metrics count the waits, by tool
    store = redis.Redis.from_url(scenario.broker.backend)
    series = 'cleveragents_limit_waits_total{skill="test/limits",tool="test/one-at-a-time"}'
    wait_until(lambda: series in render(store), 30, "the waits to be counted")
    assert "cleveragents_limit_wait_seconds_total" in render(store)
    store.close()


def test_a_rate_spreads_starts_across_two_workers(scenario: WorkerScenario) -> None:
    client = scenario.client
    scenario.start_worker(concurrency=2)
    scenario.start_worker(concurrency=2)
    log = scenario.folder / "rated.jsonl"
    began = time.time()
    handles = [
        client.submit("test/limits", "test/five-a-second", {"log": str(log), "key": f"r{n}"})
        for n in range(30)
    ]
    for handle in handles:
        assert handle.result(timeout=60).success
    took = time.time() - began
    starts = sorted(row["start"] for row in runs(log))
    assert len(starts) == 30
    # No more than 5 starts in any 1 s window, on the tools' own clocks (a start counts
    # for its window and a margin: the tool starts a little after its permit)
    for n, start in enumerate(starts):
        assert sum(1 for s in starts[n:] if s < start + 1.0) <= 5, starts
    # 30 at 5 a second: the last five start after about 5.5 s (the margin); well within
    # twice the ideal 6 s (a benchmark, not this test, holds the 1.2x)
    assert took < 12.0, took


def test_a_slot_held_by_a_killed_worker_comes_back_within_the_recovery_time(
    scenario: WorkerScenario,
) -> None:
    client = scenario.client
    recovery = {"CLEVERAGENTS_RECOVERY_S": "4"}
    first = scenario.start_worker(**recovery)
    log = scenario.folder / "limited.jsonl"
    # Given a worker running the one-at-a-time tool for long
    # (its message is handed to the next worker too, where it ends at once: ``once``)
    once = str(scenario.folder / "slept")
    long = client.submit("test/limits", "test/one-at-a-time",
                         {"log": str(log), "key": "long", "seconds": 60, "once": once})  # fmt: skip
    # (STARTED is stored when the id is bound, before the tool runs: a kill in between
    # would leave ``once`` for the next worker's run, which would then sleep the 60 s)
    wait_until(lambda: client.state(long.request_id) == "STARTED", 30, "the long run to start")
    wait_until(lambda: Path(once).exists(), 30, "the long run's tool to start sleeping")
    # When it is killed with kill -9, and another run of the tool is sent to another worker
    assert first.proc is not None
    kill_group(first.proc, signal.SIGKILL)
    killed = time.time()
    scenario.start_worker(**recovery)
    handle = client.submit("test/limits", "test/one-at-a-time", {"log": str(log), "key": "next"})
    assert handle.result(timeout=60).success
    # Then it started within the recovery time of the kill (plus the start-up of the worker)
    [row] = runs(log, "next")
    assert row["start"] - killed < 4.0 + 3.0, row["start"] - killed


def test_flower_is_told_that_an_invocation_waits_for_its_limits(
    redis_url: str, client: SkillClient, start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    start_worker(redis_url)
    app = client.app
    state = app.events.State()
    told: list[str] = []
    receivers: list[Any] = []

    def watch() -> None:
        def on_event(event: dict[str, Any]) -> None:
            state.event(event)
            if event["type"] == "task-retried":
                told.append(str(event.get("exception")))

        with app.connection() as conn:
            receiver = app.events.Receiver(conn, handlers={"*": on_event})
            receivers.append(receiver)
            with contextlib.suppress(TimeoutError, OSError):
                receiver.capture(limit=None, timeout=1, wakeup=False)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    log = tmp_path / "limited.jsonl"
    handles = [
        client.submit("test/limits", "test/one-at-a-time",
                      {"log": str(log), "key": f"f{n}", "seconds": 2})
        for n in range(2)
    ]  # fmt: skip
    wait_until(lambda: bool(told), 30, "a task-retried event")
    assert "waiting for the limits of test/one-at-a-time" in told[0]
    waiting = [h for h in handles if state.tasks.get(h.request_id) is not None]
    assert any(state.tasks[h.request_id].state == "RETRY" for h in waiting)
    for handle in handles:
        assert handle.result(timeout=60).success
    receivers[0].should_stop = True
    watcher.join(10)
    assert not watcher.is_alive()
