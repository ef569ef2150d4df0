"""A write is counted and logged once, by the run that did it, whoever else delivers its id.

A second delivery of a write whose first run is still going (the same request sent
twice, a resumed batch whose first run's chunk still runs) waits for that run and
answers with its result: the metrics and the log line are that run's, not counted again.
"""

from __future__ import annotations

import json
from pathlib import Path

import redis

from cleveragents.stores import RedisMetricStore
from tests.support.fault_rig import SKILL, WRITE, BatchThread, request, rig, submit
from tests.support.procs import wait_until


def _successes(url: str) -> int:
    counts = RedisMetricStore(redis.Redis.from_url(url)).totals()
    return sum(
        n
        for field, n in counts.invocations.items()
        if json.loads(field)[:3] == [SKILL, WRITE, "success"]
    )


def _logged(log_text: str, request_id: str) -> int:
    said = f"invocation request_id={request_id} "
    return sum(1 for line in log_text.splitlines() if said in line)


def test_a_write_delivered_twice_while_it_runs_is_counted_and_logged_once(
    tmp_path: Path,
) -> None:
    with rig(tmp_path / "rig") as r:
        worker = r.start_worker(concurrency=2)
        client = r.client()
        # Given a write sent twice under one id: the second delivery finds the first running
        body = request(WRITE, "once-single", r.records.path, sleep_s=2.0)
        submit(client, body)
        wait_until(lambda: r.records.counts()["once-single"] == 1, 30, "the first run")
        second = client.submit(
            client.build_request(
                body["skill"], body["tool"], body["arguments"], request_id="once-single",
                allow_writes=True,
            )
        )
        assert second.result(timeout=60).success
        # And a batch run twice at once: the second's lines find the first's running
        lines = [request(WRITE, f"once-batch-{i}", r.records.path, sleep_s=0.3) for i in range(6)]
        first_run = BatchThread(client, lines, chunk_size=3).start()
        wait_until(lambda: r.records.counts()["once-batch-0"] == 1, 30, "the batch started")
        second_run = BatchThread(r.client(), lines, chunk_size=3).start()
        assert first_run.join(60)
        assert second_run.join(60)
        assert [res.success for res in second_run.results] == [True] * 6
        # Then each write ran once, and is counted once and logged once
        assert r.records.counts() == {"once-single": 1, **{f"once-batch-{i}": 1 for i in range(6)}}
        # Once the worker has shut down, every count it made is in Redis (its processes
        # flush their counts as they leave)
        worker.shut_down()
        assert _successes(r.url) == 7
        log = worker.log_text()
        assert _logged(log, "once-single") == 1, log[-3000:]
        assert [_logged(log, f"once-batch-{i}") for i in range(6)] == [1] * 6
