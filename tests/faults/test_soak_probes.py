"""The soak's account of a slow recovery (benchmarks/soak_probes.py), on worker logs as
Celery writes them: the bound, the timeline, the line of invocations ahead."""

from __future__ import annotations

import time
from pathlib import Path

from benchmarks.soak import Report
from benchmarks.soak_probes import Probe, bound_s, queued_ahead, timeline, timeline_lines

DAY = "2026-12-06"


def _at(clock: str) -> float:
    return time.mktime(time.strptime(f"{DAY} {clock}", "%Y-%m-%d %H:%M:%S"))


def _line(clock: str, millis: int, process: str, message: str) -> str:
    return f"[{DAY} {clock},{millis:03d}: INFO/{process}] {message}"


def test_a_slow_probe_is_told_with_where_it_waited_and_what_was_ahead(tmp_path: Path) -> None:
    # Given a probe sent at 10:00:00 and, in one worker's log, two older invocations
    # and a batch chunk received before it, 12 s later
    log = tmp_path / "w1.log"
    log.write_text(
        "\n".join(
            [
                _line("10:00:03", 0, "MainProcess", "Task skills.invoke[p1-0000005] received"),
                _line("10:00:05", 0, "MainProcess", "Task skills.invoke_chunk[ab-cd] received"),
                _line("10:00:07", 0, "MainProcess", "Task skills.invoke[p2-0000009] received"),
                _line("10:00:08", 0, "MainProcess", "Task skills.invoke[p2-0000011] received"),
                _line("10:00:12", 0, "MainProcess", "Task skills.invoke[probe-0000010] received"),
                _line("10:00:12", 50, "ForkPoolWorker-1", "invocation request_id=probe-0000010"),
            ]
        )
    )
    probe = Probe("probe-0000010", "SIGSTOP worker", _at("10:00:00"), took_s=12.2)
    records = [("probe-0000010", 4242, _at("10:00:12") + 0.04)]
    # When it is explained
    steps = timeline(probe, {"w1": log}, records)
    lines = timeline_lines(probe, steps)
    # Then the timeline names the worker, the 12 s gap before its receipt, the run
    assert "w1 MainProcess" in lines[2], lines
    assert "(+12.0 s)" in lines[2], lines
    assert any("pid 4242" in line for line in lines), lines
    # And what was received ahead of it: two older invocations (not the newer) and a chunk
    assert queued_ahead(probe, {"w1": log}) == (2, 1)


def test_a_recovery_past_its_bound_breaks_the_soak() -> None:
    redis_kill = Probe("probe-1", "kill -9 redis", 0.0, outage_s=2.5)
    worker_kill = Probe("probe-2", "kill -9 worker", 0.0, outage_s=2.5)
    # A Redis kill's bound counts its outage; a worker's does not
    assert (bound_s(redis_kill, 8.0), bound_s(worker_kill, 8.0)) == (10.5, 8.0)
    report = Report("redis", 1.0)
    assert report.held
    report.over_bound.append("SIGTERM worker: 32.4 s > 8.0 s")
    assert not report.held
