"""Retries a tool declares (``retry:``), through real workers on Redis and on RabbitMQ.

Only a transient failure is retried (``TransientToolError``, exit 75), a write only when
idempotent; the retry goes back to the broker with its delay, under the same request
id, and the final result says how many attempts ran.
"""

from __future__ import annotations

import itertools
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from celery.result import AsyncResult

from cleveragents.client import SkillClient
from cleveragents.messages import retry_note
from tests.conftest import EVERY_BROKER, Broker, broker_for
from tests.support.procs import Worker, kill_group, wait_until
from tests.support.worker_runs import WorkerScenario, runs

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(params=EVERY_BROKER)
def broker(request: pytest.FixtureRequest, redis_url: str) -> Broker:
    """Redis, RabbitMQ, and the embedded default (issue 44: the fleet's queue tests)."""
    return broker_for(request, redis_url)


def test_a_read_failing_twice_succeeds_on_its_third_attempt_after_its_backoff(
    scenario: WorkerScenario,
) -> None:
    scenario.start_worker()
    log = scenario.folder / "runs.jsonl"
    args = {"log": str(log), "key": "a", "fail_times": 2}
    result = scenario.client.submit("test/retries", "test/flaky-3", args).result(timeout=60)
    assert result.success, result.error
    assert result.output_data == {"runs": 3}
    starts = [row["start"] for row in runs(log, "a")]
    # The k-th retry waits about backoff_s * 2^(k-1): 1 s, then 2 s (jitter: 10 %)
    gaps = [later - earlier for earlier, later in itertools.pairwise(starts)]
    assert 0.85 < gaps[0] < 1.8, gaps
    assert 1.75 < gaps[1] < 2.9, gaps


def test_the_last_attempt_fails_saying_how_many_ran(scenario: WorkerScenario) -> None:
    scenario.start_worker()
    log = scenario.folder / "runs.jsonl"
    args = {"log": str(log), "key": "b", "fail_times": 5}
    result = scenario.client.submit("test/retries", "test/flaky-2", args).result(timeout=60)
    assert not result.success
    assert result.error is not None
    assert result.error.details["attempts"] == 2
    assert result.error.details["transient"] is True
    assert len(runs(log, "b")) == 2


def test_only_a_transient_failure_is_retried_and_a_write_only_when_idempotent(
    redis_url: str, client: SkillClient, start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    start_worker(redis_url)
    log = tmp_path / "runs.jsonl"
    # A plain error is final at once
    broken = client.submit("test/retries", "test/broken", {"log": str(log), "key": "x"})
    # A write that is not idempotent keeps its at-most-once promise: one run
    write = client.submit(
        "test/retries", "test/flaky-write", {"log": str(log), "key": "w", "fail_times": 1},
        allow_writes=True,
    )  # fmt: skip
    # An idempotent write is retried
    idempotent = client.submit(
        "test/retries", "test/flaky-idempotent-write",
        {"log": str(log), "key": "i", "fail_times": 1}, allow_writes=True,
    )  # fmt: skip
    failed = broken.result(timeout=60)
    assert failed.error is not None
    assert failed.error.details["attempts"] == 1
    assert len(runs(log, "x")) == 1
    once = write.result(timeout=60)
    assert not once.success
    assert len(runs(log, "w")) == 1
    assert idempotent.result(timeout=60).success
    assert len(runs(log, "i")) == 2


def test_a_command_tool_exiting_75_is_retried(
    redis_url: str, client: SkillClient, start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    start_worker(redis_url, CLEVERAGENTS_TOOL_USER="root")
    marker = tmp_path / "marker"
    result = client.submit("test/retries", "test/tempfail", {"marker": str(marker)}).result(
        timeout=60
    )
    assert result.success, result.error
    assert marker.exists()


def test_a_worker_killed_during_the_delay_loses_nothing(scenario: WorkerScenario) -> None:
    client = scenario.client
    # Given a worker holding a retry that waits its delay (1 s)
    first = scenario.start_worker(CLEVERAGENTS_RECOVERY_S="4")
    log = scenario.folder / "runs.jsonl"
    handle = client.submit("test/retries", "test/flaky-3", {"log": str(log), "key": "k",
                                                           "fail_times": 1})  # fmt: skip
    wait_until(lambda: client.state(handle.request_id) == "RETRY", 30, "the first attempt")
    # (`cleveragents result` reads which attempt failed and when the next is due)
    note = retry_note(AsyncResult(handle.request_id, app=client.app).info)
    assert note is not None
    assert note[1] is not None
    assert note[0].startswith("attempt 1 failed (tool_execution_failure); attempt 2 is due at ")
    # When it is killed before the retry is due
    assert first.proc is not None
    kill_group(first.proc, signal.SIGKILL)
    # Then another worker runs the retry
    scenario.start_worker(CLEVERAGENTS_RECOVERY_S="4")
    result = handle.result(timeout=60)
    assert result.success, result.error
    # (A kill between sending the retry and acknowledging the first attempt's message
    # runs that attempt again too: a read, or an idempotent write, may run twice.)
    assert 2 <= len(runs(log, "k")) <= 3


def test_a_batch_line_retries_on_its_own_and_its_chunk_does_not_wait_for_it(
    scenario: WorkerScenario,
) -> None:
    scenario.start_worker()
    log = scenario.folder / "runs.jsonl"
    # A chunk of 20 lines: one fails once (retried after about 1 s), the others at once
    lines = [
        {"skill": "test/retries", "tool": "test/flaky-3",
         "arguments": {"log": str(log), "key": f"b{n}", "fail_times": 1 if n == 3 else 0}}
        for n in range(20)
    ]  # fmt: skip
    results = list(scenario.client.batches.run_many(lines, chunk_size=20))
    assert all(result.success for result in results), [r.error for r in results]
    assert [r.output_data for r in results][3] == {"runs": 2}
    # The other lines ran before the retry was due: the chunk went on without it
    flaky = runs(log, "b3")
    others = [row["end"] for n in range(20) if n != 3 for row in runs(log, f"b{n}")]
    assert max(others) < flaky[1]["start"]


def test_an_unreachable_mcp_server_is_a_transient_failure(
    redis_url: str, client: SkillClient, start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    skills = tmp_path / "skills"
    skills.mkdir()
    (skills / "remote.yaml").write_text(
        "name: test/remote\n"
        "tools:\n"
        "  - name: test/away\n"
        "    source: mcp\n"
        "    server: {url: 'http://127.0.0.1:9/mcp'}\n"  # discard: nobody listens
        "    remote_tool: echo\n"
        "    retry: {attempts: 2, backoff_s: 0.1}\n"
        "    input_schema: {type: object}\n",
        encoding="utf-8",
    )
    start_worker(redis_url, CLEVERAGENTS_CATALOGUE=str(skills))
    result = client.submit("test/remote", "test/away", {}).result(timeout=60)
    assert not result.success
    assert result.error is not None
    assert result.error.details["transient"] is True
    assert result.error.details["attempts"] == 2


def test_every_failure_says_how_many_attempts_ran(
    redis_url: str, client: SkillClient, start_worker: Callable[..., Worker]
) -> None:
    start_worker(redis_url)
    # A tool without a retry policy: its one attempt
    result = client.submit("test/basic", "test/crash", {}).result(timeout=60)
    assert result.error is not None
    assert result.error.details["attempts"] == 1
