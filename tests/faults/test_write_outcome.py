"""A failed write says whether its effect may have happened (``details["write_outcome"]``).

``unknown``: the tool started (it failed, timed out, or was stopped or lost before it
reported back): the caller checks before sending it again. ``not_started``: a gate,
validation or activation refused it first: the write did not happen.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from cleveragents.runtime.outcomes import UNKNOWN_WRITE_ADVICE
from tests.conftest import EVERY_BROKER, Broker, broker_for
from tests.support.worker_runs import WorkerScenario, cli

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(params=EVERY_BROKER)
def broker(request: pytest.FixtureRequest, redis_url: str) -> Broker:
    """Redis, RabbitMQ, and the embedded default (issue 44: the fleet's queue tests)."""
    return broker_for(request, redis_url)

SKILL, WRITE, READ = "test/faults", "test/write-once", "test/read"


def _submit(broker: Broker, *args: str) -> subprocess.CompletedProcess[str]:
    return cli(broker, "submit", SKILL, *args, "--wait")


def test_a_write_that_timed_out_after_writing_says_it_may_have_happened(
    scenario: WorkerScenario,
) -> None:
    scenario.start_worker()
    ledger = scenario.folder / "ledger"
    # Given a write that records its effect, then runs past its timeout
    arguments = {"path": str(ledger), "key": "w1", "sleep_s": 30}
    timed_out = scenario.client.submit(SKILL, WRITE, arguments, allow_writes=True, timeout_s=1)
    result = timed_out.result(timeout=90)
    # Then its result says the write may have happened, and what to do
    assert result.error is not None
    assert result.error.details["reason"] == "timeout"
    assert result.error.details["write_outcome"] == "unknown"
    assert UNKNOWN_WRITE_ADVICE in result.error.message
    assert ledger.read_text(encoding="utf-8").split()[0] == "w1"  # it had happened
    # And the CLI leads its fix lines with it
    shown = _submit(
        scenario.broker, WRITE, "--args", json.dumps({**arguments, "key": "w2"}), "--allow-writes",
        "--timeout", "1",
    )  # fmt: skip
    assert shown.returncode == 1
    fixes = [line for line in shown.stderr.splitlines() if line.startswith("fix: ")]
    assert fixes[0] == f"fix: {UNKNOWN_WRITE_ADVICE}", shown.stderr
    assert "timeout_s" in fixes[1]


def test_a_write_refused_before_it_started_says_it_did_not_happen(scenario: WorkerScenario) -> None:
    scenario.start_worker()
    ledger = scenario.folder / "ledger"
    arguments = {"path": str(ledger), "key": "r1"}
    # A write sent without allow_writes (the request's gate), and one with a bad argument
    refused = scenario.client.submit(SKILL, WRITE, arguments).result(timeout=60)
    invalid = scenario.client.submit(
        SKILL, WRITE, {**arguments, "sleep_s": "long"}, allow_writes=True
    ).result(timeout=60)
    for result, error_type in ((refused, "permission_denied"), (invalid, "validation_error")):
        assert result.error is not None
        assert result.error.error_type == error_type
        assert result.error.details["write_outcome"] == "not_started"
        assert "may have happened" not in result.error.message
    assert not ledger.exists()
    # A read says nothing of a write
    read = scenario.client.submit(SKILL, READ, {**arguments, "sleep_s": 30}, timeout_s=1)
    failed = read.result(timeout=60)
    assert failed.error is not None
    assert "write_outcome" not in failed.error.details
