"""The soak of benchmarks/soak.py, for half a minute on Redis: load, batches and chaos,
then every promise counted (its 30-minute runs on both brokers are quoted in
docs/operations.md; the suite keeps this one short)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.procs import REPO

pytestmark = pytest.mark.timeout(400)


def test_half_a_minute_of_load_batches_and_chaos_loses_nothing_and_runs_no_write_twice() -> None:
    run = subprocess.run(
        [
            sys.executable, str(REPO / "benchmarks" / "soak.py"), "--json",
            "--minutes", "0.5", "--rate", "10", "--chaos-every", "5", "--stop-scale", "0.25",
            "--batch-every", "12", "--batch-lines", "150",
        ],
        cwd=REPO, capture_output=True, text=True, timeout=380,
    )
    assert run.returncode in (0, 1), run.stderr[-3000:]
    report = json.loads(run.stdout)
    # Given half a minute of mixed invocations, two batches and chaos every few seconds
    assert sum(report["invocations"].values()) > 200, report
    assert report["batches"] >= 2, report
    assert sum(report["chaos"].values()) >= 3, report  # each waits for its recovery
    # Then nothing is lost, no write that must run once ran twice, batches come in order
    assert report["lost"] == 0, report
    assert report["duplicate_writes"] == 0, report
    assert report["batches_out_of_order"] == 0, report
    assert report["held"] is True
    # And every key an invocation leaves has a time to live; every fault was recovered
    assert report["keys_without_ttl"] == {}, report
    assert report["longest_recovery_s"] < 60, report
    # And the only failed results are the requests made to fail, and interrupted writes
    assert set(report["failures"]) <= {
        "validation_error/-", "tool_execution_failure/write_interrupted"
    }, report
    # And no Redis restart left an ERROR or a traceback in a worker's log
    assert not [kind for kind in report["log_errors"] if "Redis" in kind or "Gossip" in kind], (
        report["log_errors"]
    )
