"""A failed write says whether its effect may have happened (``details["write_outcome"]``).

``unknown``: the tool started (it failed, timed out, or was stopped or lost before it
reported back): the caller checks before sending it again. ``not_started``: a gate,
validation or activation refused it first: the write did not happen.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from cleveragents.client import SkillClient
from cleveragents.runtime.outcomes import UNKNOWN_WRITE_ADVICE
from tests.conftest import Broker
from tests.support.procs import REPO, Worker

pytestmark = pytest.mark.timeout(180)

SKILL, WRITE, READ = "test/faults", "test/write-once", "test/read"


def _submit(broker: Broker, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLEVERAGENTS_")}
    return subprocess.run(
        [sys.executable, "-m", "cleveragents", "submit", SKILL, *args, "--wait"],
        env={**env, **broker.env, "PYTHONPATH": str(REPO)}, cwd=REPO,
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_a_write_that_timed_out_after_writing_says_it_may_have_happened(
    broker: Broker,
    broker_client: SkillClient,
    start_worker: Callable[..., Worker],
    tmp_path: Path,
) -> None:
    start_worker(broker)
    ledger = tmp_path / "ledger"
    # Given a write that records its effect, then runs past its timeout
    arguments = {"path": str(ledger), "key": "w1", "sleep_s": 30}
    timed_out = broker_client.submit(SKILL, WRITE, arguments, allow_writes=True, timeout_s=1)
    result = timed_out.result(timeout=90)
    # Then its result says the write may have happened, and what to do
    assert result.error is not None
    assert result.error.details["reason"] == "timeout"
    assert result.error.details["write_outcome"] == "unknown"
    assert UNKNOWN_WRITE_ADVICE in result.error.message
    assert ledger.read_text(encoding="utf-8").split()[0] == "w1"  # it had happened
    # And the CLI leads its fix lines with it
    shown = _submit(
        broker, WRITE, "--args", json.dumps({**arguments, "key": "w2"}), "--allow-writes",
        "--timeout", "1",
    )  # fmt: skip
    assert shown.returncode == 1
    fixes = [line for line in shown.stderr.splitlines() if line.startswith("fix: ")]
    assert fixes[0] == f"fix: {UNKNOWN_WRITE_ADVICE}", shown.stderr
    assert "timeout_s" in fixes[1]


def test_a_write_refused_before_it_started_says_it_did_not_happen(
    broker: Broker,
    broker_client: SkillClient,
    start_worker: Callable[..., Worker],
    tmp_path: Path,
) -> None:
    start_worker(broker)
    ledger = tmp_path / "ledger"
    arguments = {"path": str(ledger), "key": "r1"}
    # A write sent without allow_writes (the request's gate), and one with a bad argument
    refused = broker_client.submit(SKILL, WRITE, arguments).result(timeout=60)
    invalid = broker_client.submit(
        SKILL, WRITE, {**arguments, "sleep_s": "long"}, allow_writes=True
    ).result(timeout=60)
    for result, error_type in ((refused, "permission_denied"), (invalid, "validation_error")):
        assert result.error is not None
        assert result.error.error_type == error_type
        assert result.error.details["write_outcome"] == "not_started"
        assert "may have happened" not in result.error.message
    assert not ledger.exists()
    # A read says nothing of a write
    read = broker_client.submit(SKILL, READ, {**arguments, "sleep_s": 30}, timeout_s=1)
    failed = read.result(timeout=60)
    assert failed.error is not None
    assert "write_outcome" not in failed.error.details
