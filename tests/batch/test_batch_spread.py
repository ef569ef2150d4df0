"""A batch of slow tools spreads over every pool process: chunks are sliced and split by time.

A worker runs a chunk for one time slice, reading the clock after every invocation,
and sends the rest back as messages of about ``PIECE_S`` of work each (as the slice
measured it), which the other processes take at once (cleveragents/pipeline/chunk.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cleveragents.client import SkillClient
from cleveragents.constants import BATCH_HEADER, QUEUE_BATCH
from cleveragents.embedded.runner import home_client
from cleveragents.embedded.server import join_server, leave_server
from cleveragents.embedded.withdraw import withdraw
from cleveragents.messages import ChunkContext
from cleveragents.pipeline.chunk import MAX_PIECES, PIECE_S, pieces
from cleveragents.settings import Settings
from tests.support.procs import Worker

StartWorker = Callable[..., Worker]

SLEEP_S = 0.2


def test_a_quick_rest_goes_back_whole() -> None:
    assert pieces(480, 0.0001) == [480]
    assert pieces(1, 10.0) == [1]


def test_a_slow_rest_goes_back_in_even_pieces_of_about_the_piece_time() -> None:
    # 9 requests of 0.1 s: 0.9 s of work, three pieces of about PIECE_S
    assert pieces(9, PIECE_S / 2.5) == [3, 3, 3]
    # Much work: at most MAX_PIECES, as even as they go, in order, every request once
    sizes = pieces(299, SLEEP_S)
    assert len(sizes) == MAX_PIECES
    assert sum(sizes) == 299
    assert max(sizes) - min(sizes) <= 1
    # Never more pieces than requests
    assert pieces(3, 60.0) == [1, 1, 1]


def test_a_piece_of_a_chunk_keeps_the_item_numbers_of_its_requests() -> None:
    context = ChunkContext("b-1", tuple(range(101, 111)), 1000)
    assert context.rest(3, 4).items == (104, 105, 106, 107)
    assert context.rest(3).items == tuple(range(104, 111))
    assert context.rest(3, 4).describe() == "batch b-1 · items 104-107 of 1000"


def test_the_rests_a_worker_sent_back_are_withdrawn_with_their_batch(tmp_path: Path) -> None:
    # Given, on the embedded default, a chunk the run sent, a rest the worker sent
    # back (a new id, the same batch), and another batch's chunk
    settings = Settings.from_env({"CLEVERAGENTS_HOME": str(tmp_path / "home")})
    join_server(settings.home)
    client = home_client(settings.home)
    try:
        messages = {"sent": "b-1", "rest": "b-1", "other": "b-2"}
        for message_id, batch_id in messages.items():
            headers = {"id": message_id, BATCH_HEADER: {"id": batch_id, "items": [[1, 2]]}}
            client.lpush(QUEUE_BATCH, json.dumps({"headers": headers}))
        # When the run withdraws what it sent
        assert withdraw(settings, ["sent"], batch_id="b-1") == 2
        # Then its batch's messages are gone, the other batch's stay
        left = [json.loads(raw)["headers"]["id"] for raw in client.lrange(QUEUE_BATCH, 0, -1)]
        assert left == ["other"]
    finally:
        client.close()
        leave_server(settings.home)


def read(log: Path, key: str) -> dict[str, Any]:
    return {
        "skill": "test/faults",
        "tool": "test/read",
        "arguments": {"path": str(log), "key": key, "sleep_s": SLEEP_S},
    }


@pytest.mark.slow
def test_a_batch_of_slow_tools_runs_on_both_pool_processes_at_once(
    client: SkillClient, redis_url: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    # Given one worker of two processes, and 60 invocations of a 200 ms tool: one
    # chunk message (a chunk holds up to 500), 12 s on one process, 6 s on two
    start_worker(redis_url, concurrency=2)
    log = tmp_path / "runs.log"
    n = 60
    # When they run as one batch
    started = time.monotonic()
    results = list(client.batches.run_many([read(log, f"k-{i:02d}") for i in range(n)]))
    elapsed = time.monotonic() - started
    # Then every one ran once, and both processes ran them, side by side
    assert all(r.success for r in results), [r.error for r in results if not r.success][:3]
    records = [line.split() for line in log.read_text().splitlines()]
    assert sorted(key for key, _, _ in records) == [f"k-{i:02d}" for i in range(n)]
    runs = [(int(pid), float(at)) for _, pid, at in records]  # each started, then slept
    by_pid: dict[int, int] = {}
    for pid, _ in runs:
        by_pid[pid] = by_pid.get(pid, 0) + 1
    assert len(by_pid) == 2, by_pid
    assert min(by_pid.values()) >= n // 4, by_pid
    # In one process at a time no two runs overlap; side by side most do
    overlapping = sum(
        1
        for pid, at in runs
        if any(other != pid and abs(at - when) < SLEEP_S for other, when in runs)
    )
    assert overlapping >= n // 2, (overlapping, by_pid)
    # Well under the 12 s of one process (6 s is the ideal; the machine is shared)
    assert elapsed < 10.5, elapsed
