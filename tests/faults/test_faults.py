"""Faults: worker processes and Redis killed and restarted, by PID, at chosen moments.

Every test gets its own private ``redis-server`` (a free port, AOF on with
``appendfsync always``) and real worker processes, and kills all of them by PID
when it ends. The invariants, counted rather than sampled:

* results stored = requests accepted (nothing is lost);
* a non-idempotent write runs at most once per request id (the tool itself
  appends ``<key> <pid>`` to a file on every execution, so the count is the
  tool's own);
* a poison message (a tool that kills its process every time) is finished with a
  failure after a bounded number of deliveries, and the worker keeps serving.

The ``scenario_*`` functions return what they measured, so that
``benchmarks/fault_table.py`` runs the same code larger and several times.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from cleveragents.constants import FIRST_RUN_POLL_S
from cleveragents.pipeline.guard import MAX_ATTEMPTS
from cleveragents.skills import SkillErrorType
from tests.support.fault_rig import (
    IDEMPOTENT,
    READ,
    VISIBILITY_S,
    WRITE,
    Rig,
    reason,
    request,
    rig,
    submit,
)
from tests.support.fault_scenarios import (
    scenario_child_kill_mid_tool,
    scenario_child_kills_under_load,
    scenario_duplicate_submission,
    scenario_outlive_visibility,
    scenario_poison,
    scenario_poison_in_batch,
    scenario_redis_outage,
    scenario_redis_restart,
    scenario_reply_lost_in_flight,
    scenario_worker_kill,
)
from tests.support.worker_runs import deliveries

# --------------------------------------------------------------------------- tests


@pytest.fixture
def fault_rig(tmp_path: Path) -> Iterator[Rig]:
    with rig(tmp_path / "rig") as made:
        yield made


@pytest.fixture
def short_visibility_rig(tmp_path: Path) -> Iterator[Rig]:
    with rig(tmp_path / "rig", visibility_s=2.0) as made:
        yield made


# 1. A pool process killed mid-tool.


@pytest.mark.timeout(60)
def test_a_killed_pool_process_reruns_reads_but_never_a_write(fault_rig: Rig) -> None:
    seen = scenario_child_kill_mid_tool(fault_rig, tools=(READ, IDEMPOTENT, WRITE))

    for tool in (READ, IDEMPOTENT):
        result = seen[tool]["result"]
        assert result.success, (tool, result.error)
        assert len(seen[tool]["pids"]) == 2, seen[tool]  # run again, after the kill
        assert seen[tool]["pids"][1] != seen[tool]["killed"]
    write = seen[WRITE]
    assert len(write["pids"]) == 1, write  # never run again
    result = write["result"]
    assert not result.success
    assert result.error is not None
    assert result.error.error_type == SkillErrorType.TOOL_EXECUTION_FAILURE
    assert reason(result) == "write_interrupted"
    for tool in seen:
        assert seen[tool]["stored"] == seen[tool]["result"]


@pytest.mark.timeout(90)
def test_pool_processes_killed_under_load_lose_nothing_and_repeat_no_write(
    fault_rig: Rig,
) -> None:
    outcome = scenario_child_kills_under_load(fault_rig, 30, kills=3, deadline_s=45)

    assert outcome.lost == 0, outcome
    assert outcome.write_dupes == 0, outcome
    assert outcome.failed == 0, outcome  # reads and idempotent writes were simply rerun


# 2. The whole worker killed mid-batch, then a new worker.


@pytest.mark.timeout(90)
def test_a_batch_whose_worker_is_killed_completes_on_a_new_worker(fault_rig: Rig) -> None:
    # The new worker comes up once the visibility timeout of the killed one's messages
    # has passed: its start-up sweep hands them out again.
    outcome = scenario_worker_kill(fault_rig, 150, restart_after_s=VISIBILITY_S + 0.5)

    print(outcome)
    assert outcome.client_error is None, outcome
    assert outcome.lost == 0, outcome
    assert outcome.write_dupes == 0, outcome
    assert outcome.recover_s is not None, outcome
    assert outcome.recover_s < 20, outcome


@pytest.mark.timeout(60)
def test_a_worker_restarted_at_once_recovers_within_the_visibility_timeout(
    fault_rig: Rig,
) -> None:
    outcome = scenario_worker_kill(fault_rig, 150, restart_after_s=0.0, deadline_s=VISIBILITY_S + 8)

    print(outcome)
    assert outcome.write_dupes == 0, outcome
    assert outcome.lost == 0, outcome
    assert outcome.recover_s is not None, outcome


# 3. redis-server restarted mid-batch.


@pytest.mark.timeout(60)
def test_workers_store_every_result_of_a_batch_across_a_redis_kill_and_restart(
    fault_rig: Rig,
) -> None:
    outcome = scenario_redis_restart(fault_rig, 150, down_s=0.0, sig=signal.SIGKILL)

    print(outcome)
    assert outcome.lost == 0, outcome
    assert outcome.write_dupes == 0, outcome
    assert "the worker process exited" not in outcome.notes, outcome


@pytest.mark.timeout(60)
def test_workers_store_every_result_of_a_batch_across_a_3s_redis_stop(fault_rig: Rig) -> None:
    outcome = scenario_redis_restart(fault_rig, 150, down_s=3.0, sig=signal.SIGTERM)

    print(outcome)
    assert outcome.lost == 0, outcome
    assert outcome.write_dupes == 0, outcome
    assert "the worker process exited" not in outcome.notes, outcome


@pytest.mark.timeout(60)
def test_run_many_itself_rides_out_a_3s_redis_outage(fault_rig: Rig) -> None:
    outcome = scenario_redis_restart(fault_rig, 60, down_s=3.0)

    print(outcome)
    assert outcome.lost == 0, outcome  # the workers' part
    assert outcome.client_error is None, outcome  # the producer's part
    assert not outcome.notes, outcome


# 4. A worker that loses Redis for a while.


@pytest.mark.timeout(60)
def test_an_idle_worker_serves_new_submissions_after_a_5s_redis_outage(fault_rig: Rig) -> None:
    outcome = scenario_redis_outage(fault_rig, down_s=5.0, busy=False)

    print(outcome)
    assert outcome.lost == 0, outcome
    assert not outcome.notes, outcome
    assert outcome.recover_s is not None, outcome
    assert outcome.recover_s < 15, outcome


@pytest.mark.timeout(60)
def test_a_worker_serves_again_within_seconds_of_redis_coming_back_after_a_long_outage(
    fault_rig: Rig,
) -> None:
    # Given an idle worker whose Redis broker is away for 8 s (kombu's own reconnection
    # waits 2, 4, 6 s... between attempts: the next after 12 s, 4 s after Redis is back)
    outcome = scenario_redis_outage(fault_rig, down_s=8.0, busy=False)

    # Then reads sent as Redis comes back are all served within 3 s of it
    print(outcome)
    assert outcome.lost == 0, outcome
    assert outcome.recover_s is not None, outcome
    assert outcome.recover_s < 3.0, outcome


@pytest.mark.timeout(60)
def test_a_busy_worker_serves_new_submissions_after_a_5s_redis_outage(fault_rig: Rig) -> None:
    outcome = scenario_redis_outage(fault_rig, down_s=5.0, busy=True, deadline_s=10)

    print(outcome)
    assert outcome.lost == 0, outcome
    assert not outcome.notes, outcome


@pytest.mark.timeout(60)
def test_an_invocation_whose_fetch_reply_is_lost_still_gets_a_result(fault_rig: Rig) -> None:
    seen = scenario_reply_lost_in_flight(fault_rig, wait_s=VISIBILITY_S + 6)

    assert seen["served_after"], seen  # the worker itself recovered
    assert seen["worker_alive"], seen
    assert seen["result"] is not None, seen  # the invocation did not
    assert seen["runs"] == 1, seen  # and it ran once


# 5. At most once.


@pytest.mark.timeout(60)
def test_a_write_submitted_twice_while_it_runs_is_executed_once(fault_rig: Rig) -> None:
    seen = scenario_duplicate_submission(fault_rig, copies=2, sleep_s=3.0, concurrency=2)

    # The second copy was delivered while the first ran, and sent back to ask again about
    # once a second until the first run's result was stored (no process waited for it)
    assert 2 <= seen["deliveries"] <= 2 + 3.0 / FIRST_RUN_POLL_S + 4, seen  # 4: a busy machine
    assert seen["runs"] == 1
    assert seen["first_seen"].success, seen
    assert seen["final"] == seen["first_seen"]


@pytest.mark.timeout(60)
def test_a_write_submitted_four_times_while_it_runs_keeps_its_result(fault_rig: Rig) -> None:
    seen = scenario_duplicate_submission(fault_rig, copies=4, sleep_s=2.0, concurrency=2)

    assert seen["runs"] == 1
    assert seen["first_seen"].success, seen
    assert seen["final"] == seen["first_seen"], seen["final"]


@pytest.mark.timeout(60)
def test_a_write_outliving_the_visibility_timeout_is_not_handed_out_again(
    short_visibility_rig: Rig,
) -> None:
    seen = scenario_outlive_visibility(short_visibility_rig, sleep_s=7.0)

    # Its worker is alive and holds it: the visibility timeout is only the last resort
    # for messages nobody holds (a write handed out again all the same, by a worker that
    # only looked dead, still runs once: test_recovery.py).
    assert seen["deliveries"] == 1, seen
    assert seen["runs"] == 1
    assert seen["result"].success, seen
    assert seen["final"] == seen["result"]


@pytest.mark.timeout(60)
def test_a_finished_request_submitted_again_returns_the_stored_result(fault_rig: Rig) -> None:
    fault_rig.start_worker()
    client = fault_rig.client()
    body = request(WRITE, "done-once", fault_rig.records.path)
    first = client.wait(submit(client, body), timeout=30)
    assert first.success, first.error

    again = client.submit(client.build_request(**{k: body[k] for k in body}))
    second = again.result(timeout=5)

    assert second == first
    assert fault_rig.records.counts()["done-once"] == 1
    assert deliveries(fault_rig.workers, "done-once") == 1  # nothing was sent again


# 6. Poison.


@pytest.mark.timeout(60)
def test_a_poison_invocation_ends_after_bounded_deliveries(fault_rig: Rig) -> None:
    seen = scenario_poison(fault_rig)

    result = seen["result"]
    assert not result.success
    assert result.error is not None
    assert result.error.error_type == SkillErrorType.TOOL_EXECUTION_FAILURE
    assert reason(result) == "poison_message"
    assert seen["runs"] == MAX_ATTEMPTS
    assert seen["served_after"]
    assert seen["worker_alive"]
    assert len(seen["dead_letters"]) == 1


@pytest.mark.timeout(60)
def test_a_poison_invocation_in_a_batch_chunk_ends_after_bounded_deliveries(
    fault_rig: Rig,
) -> None:
    outcome = scenario_poison_in_batch(fault_rig, 40, poisons=1)

    print(outcome)
    assert outcome.client_error is None, outcome
    assert outcome.recover_s is not None, outcome  # the batch ended, every result yielded
    assert outcome.lost == 0, outcome
    assert outcome.write_dupes == 0, outcome
    # Its chunk's first delivery is not counted; the next ones are: MAX_ATTEMPTS runs.
    assert fault_rig.records.counts()["pb-poison-0"] == MAX_ATTEMPTS
    assert outcome.notes[0].endswith("reason poison_message"), outcome.notes
    assert "not served afterwards" not in outcome.notes
    assert "the worker process exited" not in outcome.notes


@pytest.mark.timeout(60)
def test_invocations_sharing_a_chunk_with_a_poison_one_succeed(fault_rig: Rig) -> None:
    outcome = scenario_poison_in_batch(fault_rig, 40, poisons=1)

    print(outcome)
    assert outcome.lost == 0, outcome
    assert outcome.failed == 1, outcome  # the poison one, and only it
