"""Hostile tools, each run through a real worker on a real Redis (issue 12).

Every misbehaviour is a tool of ``tests/fixtures/hostile_tools_skills``: a python
tool that swallows its time-out, one that cannot be interrupted at all, a command
tool whose descendant escapes its session, one that snoops on every process's
environment, and floods of output from both kinds.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from cleveragents.client import SkillClient
from cleveragents.constants import HARD_LIMIT_GRACE_S
from cleveragents.skills import SkillErrorType, SkillResult
from tests.support.procs import REPO, Worker, process_alive, wait_until

pytestmark = pytest.mark.timeout(240)

StartWorker = Callable[..., Worker]
HOSTILE_SKILLS = REPO / "tests" / "fixtures" / "hostile_tools_skills"
SKILL = "test/hostile-tools"
#: The tools' timeout (hostile_tools.yaml) and the slack a loaded machine may add.
TIMEOUT_S = 1.0
SLACK_S = 3.0
SECRET = "sk-live-worker-secret-4d1e"
CONTROL = "control-value-the-tool-may-see-8b2f"
NOBODY = 65534


def _failed(result: SkillResult, reason: str) -> dict[str, Any]:
    assert not result.success, result
    assert result.error is not None
    assert result.error.error_type == SkillErrorType.TOOL_EXECUTION_FAILURE, result.error
    assert result.error.details.get("reason") == reason, result.error
    return result.error.details


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder every user may write (the tools run as ``nobody``)."""
    folder = Path(tempfile.mkdtemp(prefix="hostile-tools-"))
    folder.chmod(0o1777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _start(start_worker: StartWorker, redis_url: str, **env: str) -> Worker:
    return start_worker(redis_url, CLEVERAGENTS_CATALOGUE=str(HOSTILE_SKILLS), **env)


def _replaced(worker: Worker, before: list[int]) -> bool:
    now = worker.child_pids()
    return len(now) == len(before) and set(now) != set(before)


# --- time-outs that cannot be swallowed ------------------------------------------------------


def test_a_tool_that_swallows_its_time_out_for_ever_fails_within_its_time_out_plus_grace(
    redis_url: str, start_worker: StartWorker, client: SkillClient
) -> None:
    # Given a python tool that catches every interruption, for ever
    worker = _start(start_worker, redis_url)
    before = worker.child_pids()

    # When it runs with its 1 s timeout
    started = time.monotonic()
    result = client.submit(SKILL, "test/swallow-forever").result(timeout=60)
    elapsed = time.monotonic() - started

    # Then it is a time-out, named, within the timeout plus the hard limit's grace
    details = _failed(result, "timeout")
    assert (result.skill_name, result.tool_name) == (SKILL, "test/swallow-forever")
    assert details["hard_limit_s"] == TIMEOUT_S + HARD_LIMIT_GRACE_S
    assert TIMEOUT_S + HARD_LIMIT_GRACE_S <= elapsed < TIMEOUT_S + HARD_LIMIT_GRACE_S + SLACK_S
    # And its pool process was replaced, and the worker serves on
    wait_until(lambda: _replaced(worker, before), 30, "the pool process to be replaced")
    assert client.submit(SKILL, "test/pool-pid").result(timeout=30).success


def test_a_tool_that_swallows_its_time_out_and_returns_late_is_a_time_out(
    redis_url: str, start_worker: StartWorker, client: SkillClient
) -> None:
    # Given a python tool that swallows interruptions for 3 s, then returns a value
    _start(start_worker, redis_url)

    # When it runs with its 1 s timeout
    started = time.monotonic()
    result = client.submit(SKILL, "test/swallow-then-return", {"seconds": 3}).result(timeout=60)

    # Then the late value is not a success: the deadline is absolute
    details = _failed(result, "timeout")
    assert details["timeout_s"] == TIMEOUT_S
    assert time.monotonic() - started < TIMEOUT_S + HARD_LIMIT_GRACE_S


def test_a_tool_that_cannot_be_interrupted_costs_its_pool_process_not_the_worker(
    redis_url: str, start_worker: StartWorker, client: SkillClient
) -> None:
    # Given a python tool that blocks SIGALRM and sleeps in C for 120 s
    worker = _start(start_worker, redis_url)
    before = worker.child_pids()

    # When it runs with its 1 s timeout
    started = time.monotonic()
    handle = client.submit(SKILL, "test/unstoppable")
    result = handle.result(timeout=60)

    # Then the hard time limit ends it as a time-out of that invocation
    details = _failed(result, "timeout")
    assert (result.skill_name, result.tool_name) == (SKILL, "test/unstoppable")
    assert details["exception_type"] == "TimeLimitExceeded"
    assert time.monotonic() - started < TIMEOUT_S + HARD_LIMIT_GRACE_S + SLACK_S
    assert client.state(handle.request_id) == "FAILURE"
    # And a new pool process took its place; the worker itself lives on and serves
    wait_until(lambda: _replaced(worker, before), 30, "the pool process to be replaced")
    assert worker.alive()
    replies = [client.submit(SKILL, "test/pool-pid") for _ in range(4)]
    assert all(r.result(timeout=30).success for r in replies)


def test_a_chunk_ended_by_the_hard_limit_runs_its_other_invocations_and_ends_the_culprit(
    redis_url: str, start_worker: StartWorker, client: SkillClient
) -> None:
    # Given a batch chunk whose middle invocation cannot be interrupted
    worker = _start(start_worker, redis_url)
    requests = [
        client.build_request(SKILL, tool, request_id=f"chunk-{i}-{uuid.uuid4()}")
        for i, tool in enumerate(["test/quick-pid", "test/unstoppable", "test/quick-pid"])
    ]

    # When the chunk runs (results read from the store: chunks publish none)
    client.send_chunk(requests)
    ids = [r.request_id for r in requests]
    wait_until(lambda: all(client.get(i) is not None for i in ids), 150, "every result")
    results = [client.get(i) for i in ids]

    # Then the others succeed, and the culprit ends as a poison message: each hard
    # limit gave the chunk back, and its deliveries were counted
    first, culprit, last = results
    assert first is not None
    assert culprit is not None
    assert last is not None
    assert first.success, first.error
    assert last.success, last.error
    assert _failed(culprit, "poison_message")["attempts"] == 3
    assert worker.alive()


# --- descendants that cannot escape -----------------------------------------------------------


def test_an_escaping_grandchild_is_dead_right_after_the_result_and_both_pools_run_at_once(
    redis_url: str, start_worker: StartWorker, client: SkillClient, shared_dir: Path
) -> None:
    # Given two pool processes, and a tool whose child leaves its session holding stdout:
    # one copy prints its value and exits, the other prints and then hangs
    _start(start_worker, redis_url)
    done_file, hung_file = shared_dir / "done.pid", shared_dir / "hung.pid"
    started = time.monotonic()
    done = client.submit(SKILL, "test/escape", {"pid_file": str(done_file), "hang": False})
    hung = client.submit(SKILL, "test/escape", {"pid_file": str(hung_file), "hang": True})

    # When both have a result
    first = done.result(timeout=30)
    finished_at = time.monotonic()
    second = hung.result(timeout=30)

    # Then the one that exited is a success, decided when it exited (not a time-out)
    assert first.success, first.error
    assert finished_at - started < 2.0 + SLACK_S
    assert not process_alive(int(done_file.read_text()))
    # And the one that hung is a time-out within its timeout plus 2 s, its grandchild dead
    _failed(second, "timeout")
    assert time.monotonic() - started < 2.0 + 2.0 + SLACK_S
    assert not process_alive(int(hung_file.read_text()))
    # And both pool processes are free at once: two 1 s tools run side by side
    again = time.monotonic()
    pair = [client.submit(SKILL, "test/pool-pid", {"seconds": 1.0}) for _ in range(2)]
    results = [h.result(timeout=30) for h in pair]
    assert all(r.success for r in results)
    assert len({r.output_data["pid"] for r in results}) == 2
    assert time.monotonic() - again < 2.0 + SLACK_S


# --- secrets a tool cannot read ---------------------------------------------------------------


def _snoop(client: SkillClient) -> dict[str, Any]:
    result = client.submit(SKILL, "test/snoop", {"needles": [SECRET, CONTROL]}).result(timeout=60)
    assert result.success, result.error
    return dict(result.output_data)


def test_a_command_tool_finds_no_secret_of_its_worker_in_any_proc_environ(
    redis_url: str, start_worker: StartWorker, client: SkillClient
) -> None:
    # Given a worker with a secret in its environment: as root (tests, CI) its command
    # tools run as nobody; as an ordinary user (the compose file) they run as that user
    _start(
        start_worker,
        redis_url,
        CLEVERAGENTS_PLANTED_SECRET=SECRET,
        CLEVERAGENTS_SNOOP_CONTROL=CONTROL,
    )

    # When a command tool searches every /proc/*/environ it can open
    seen = _snoop(client)

    # Then it ran as that user and could read environments (its own holds the control)...
    assert seen["uid"] == (NOBODY if os.geteuid() == 0 else os.geteuid())
    assert seen["readable"] >= 1
    assert seen["found"][CONTROL]
    # ...and found the worker's secret in none of them (other user, or non-dumpable)
    assert seen["found"][SECRET] == []


def test_the_workers_pool_processes_are_non_dumpable(
    redis_url: str, start_worker: StartWorker, client: SkillClient
) -> None:
    # Given a worker (it makes itself non-dumpable at start, before the pool forks)
    _start(start_worker, redis_url)

    # When a python tool asks its own pool process
    result = client.submit(SKILL, "test/dumpable").result(timeout=60)

    # Then the pool process inherited it: its /proc files are root's, closed to its own user
    assert result.success, result.error
    assert result.output_data == {"dumpable": 0}


# --- bounded output ---------------------------------------------------------------------------


def _stored_bytes(redis_url: str, request_id: str) -> int:
    with redis.Redis.from_url(redis_url) as store:
        return int(store.strlen(f"celery-task-meta-{request_id}"))


@pytest.mark.parametrize("tool", ["test/flood", "test/python-flood"])
def test_a_flood_of_output_is_refused_and_the_stored_result_is_small(
    redis_url: str, start_worker: StartWorker, client: SkillClient, tool: str
) -> None:
    # Given a tool whose output is 12 MB, over the default limit of 10 MB
    _start(start_worker, redis_url)
    request_id = f"flood-{uuid.uuid4()}"

    # When it runs
    result = client.submit(SKILL, tool, {"size": 12_000_000}, request_id=request_id).result(
        timeout=120
    )

    # Then it is refused, and what Redis holds is a short failure
    details = _failed(result, "output_too_large")
    assert details["limit_bytes"] == 10_000_000
    assert 0 < _stored_bytes(redis_url, request_id) < 20_000


def test_output_just_under_the_limit_is_stored(
    redis_url: str, start_worker: StartWorker, client: SkillClient
) -> None:
    # Given a worker with a 1 MB output limit and a tool printing a little under it
    _start(start_worker, redis_url, CLEVERAGENTS_MAX_OUTPUT_BYTES="1000000")

    # When the command prints 900 KB, and then 1.1 MB
    fits = client.submit(SKILL, "test/flood", {"size": 900_000}).result(timeout=60)
    too_big = client.submit(SKILL, "test/flood", {"size": 1_100_000}).result(timeout=60)

    # Then the first is a success, the second refused
    assert fits.success, fits.error
    assert len(fits.output_data) == 900_000
    _failed(too_big, "output_too_large")


# --- a python tool that forks -----------------------------------------------------------------


def test_a_python_tool_that_forks_leaves_no_second_pool_process(
    redis_url: str, start_worker: StartWorker, client: SkillClient, shared_dir: Path
) -> None:
    # Given a python tool that forks, and whose copy returns too: the copy would go
    # on in the pool's loop, a pool process the worker does not know, taking tasks
    worker = _start(start_worker, redis_url)
    before = sorted(worker.child_pids())
    pid_file = shared_dir / "forked.pid"

    # When it runs
    result = client.submit(SKILL, "test/fork", {"pid_file": str(pid_file)}).result(timeout=30)

    # Then its result is the pool process's own, and the copy is gone at once
    assert result.success, result.error
    assert result.output_data["pid"] == result.output_data["parent"]
    assert result.output_data["pid"] in before
    wait_until(lambda: _written(pid_file), 10, "the copy's pid")
    copy = int(pid_file.read_text())
    wait_until(lambda: not process_alive(copy), 5, "the copy to be gone")
    # And the worker goes on with its own two pool processes, and every result is right
    results = [client.submit(SKILL, "test/pool-pid").result(timeout=30) for _ in range(20)]
    assert all(r.success for r in results)
    assert {r.output_data["pid"] for r in results} <= set(before)
    assert sorted(worker.child_pids()) == before
    assert worker.alive()


def test_a_python_tool_that_changes_folder_does_not_move_the_next_ones(
    redis_url: str, start_worker: StartWorker, client: SkillClient, shared_dir: Path
) -> None:
    # Given a worker whose pool processes each ran a tool that moved to another folder
    start_worker(redis_url, concurrency=1, CLEVERAGENTS_CATALOGUE=str(HOSTILE_SKILLS))
    home = client.submit(SKILL, "test/where").result(timeout=30)
    assert home.success, home.error
    moved = client.submit(SKILL, "test/chdir", {"path": str(shared_dir)}).result(timeout=30)
    assert moved.success, moved.error
    assert moved.output_data["cwd"] == str(shared_dir)

    # When the next tool runs in the same process
    after = client.submit(SKILL, "test/where").result(timeout=30)

    # Then it runs in the worker's own folder: relative paths mean what they meant
    assert after.success, after.error
    assert after.output_data["pid"] == home.output_data["pid"]
    assert after.output_data["cwd"] == home.output_data["cwd"]


def _written(path: Path) -> bool:
    """Whether ``path`` holds its line yet (a file is created before it is written)."""
    return path.exists() and bool(path.read_text(encoding="utf-8").strip())
