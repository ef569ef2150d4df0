"""A person approves a write before it runs: through real workers, on Redis and on RabbitMQ.

The write parks after its gates and validation, holding no process; ``approvals
approve`` makes it run once and ``submit --wait`` returns its result; a rejection
and an expiry end it as ``permission_denied``; the audit trail tells the story
without an argument value.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cleveragents.approvals.model import ApprovalError
from cleveragents.client import SkillClient
from cleveragents.constants import STATE_AWAITING_APPROVAL
from tests.conftest import EVERY_BROKER, Broker, broker_for
from tests.support.procs import REPO, wait_until
from tests.support.worker_runs import WorkerScenario, clean_env, cli, run_keys, runs, wait_settled

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(params=EVERY_BROKER)
def broker(request: pytest.FixtureRequest, redis_url: str) -> Broker:
    """Redis, RabbitMQ, and the embedded default (issue 44: the fleet's queue tests)."""
    return broker_for(request, redis_url)

SKILL, PAY, RECORD, PEEK = "test/approvals", "test/send-payment", "test/record", "test/peek"
#: An argument value that must never reach the audit trail.
SECRET = "acct-7731-s3cret"


def _parked(client: SkillClient, request_id: str) -> None:
    wait_until(
        lambda: client.state(request_id) == STATE_AWAITING_APPROVAL, 60, f"{request_id} to park"
    )


def _events(client: SkillClient, request_id: str) -> list[str]:
    return [e["event"] for e in client.approvals.audit(request_id=request_id)]


def test_an_approved_write_runs_once_and_submit_wait_returns_its_result(
    scenario: WorkerScenario,
) -> None:
    worker = scenario.start_worker()
    log = scenario.folder / "payments.jsonl"
    args = json.dumps({"log": str(log), "key": SECRET})
    # Given a write that needs approval, submitted with --allow-writes and --wait
    waiting = subprocess.Popen(
        [sys.executable, "-m", "cleveragents", "submit", SKILL, PAY, "--args", args,
         "--allow-writes", "--request-id", "pay-1", "--wait", "--timeout", "60", "--json"],
        env={**clean_env(), **scenario.broker.env, "PYTHONPATH": str(REPO)}, cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.extend(iter(waiting.stderr.readline, "")))  # type: ignore[union-attr]
    reader.start()
    try:
        _parked(scenario.client, "pay-1")
        # Then it is awaiting approval, listed with its skill and tool, and has not run
        shown = json.loads(cli(scenario.broker, "result", "pay-1", "--json").stdout)
        assert shown["state"] == "awaiting_approval"
        assert shown["request_id"] == "pay-1"
        listed = [
            json.loads(line)
            for line in cli(scenario.broker, "approvals", "list", "--json").stdout.splitlines()
        ]
        assert [(x["request_id"], x["skill"], x["tool"]) for x in listed] == [("pay-1", SKILL, PAY)]
        show = json.loads(cli(scenario.broker, "approvals", "show", "pay-1", "--json").stdout)
        assert show["arguments"] == {"log": str(log), "key": SECRET}
        assert runs(log) == []
        wait_until(lambda: any("approval" in line for line in said), 30, "submit to say it waits")
        # And the worker's log says once that it waits, and how to approve it (on the
        # embedded default the command's own local worker, which logs warnings only, may
        # be the one that took it)
        parked_lines = [
            line
            for line in worker.log.read_text(encoding="utf-8").splitlines()
            if f"pay-1 ({SKILL} / {PAY}) waits for approval" in line
        ]
        if scenario.broker.home is None or parked_lines:
            assert len(parked_lines) == 1, parked_lines
            assert parked_lines[0].endswith("cleveragents approvals approve pay-1")
        # When a person approves it
        approved = cli(
            scenario.broker, "approvals", "approve", "pay-1", "--by", "alice", "--reason", "ok"
        )
        assert approved.returncode == 0, approved.stderr
        waiting.wait(timeout=90)
        reader.join(10)
    finally:
        waiting.kill()
    out, err = waiting.stdout.read(), "".join(said)  # type: ignore[union-attr]
    waiting.stdout.close()  # type: ignore[union-attr]
    waiting.stderr.close()  # type: ignore[union-attr]
    # Then submit --wait said once how to approve it, and returned its result
    assert waiting.returncode == 0, err
    assert err.count("waits for a person's approval") == 1, err
    assert "cleveragents approvals approve pay-1" in err
    assert json.loads(out)["success"] is True
    assert run_keys(log) == [SECRET]  # it ran once
    # And the audit trail tells the story in order, with who approved, and no argument value
    trail = list(scenario.client.approvals.audit(request_id="pay-1"))
    assert [e["event"] for e in trail] == [
        "requested", "awaiting_approval", "approved", "started", "succeeded",
    ]  # fmt: skip
    assert trail[2]["by"] == "alice"
    assert all(e["skill"] == SKILL and e["tool"] == PAY and e["at"] for e in trail)
    assert SECRET not in json.dumps(trail)
    assert str(log) not in json.dumps(trail)
    # And approving it again changes nothing, in one line
    again = cli(scenario.broker, "approvals", "approve", "pay-1")
    assert again.returncode == 1
    assert again.stderr.strip().splitlines() == [
        "error: invocation pay-1 was already approved by alice (ok); nothing was changed"
    ]
    assert cli(scenario.broker, "approvals", "reject", "pay-1", "--reason", "no").returncode == 1
    # (once every delivery of it the worker received is answered, and nothing waits)
    wait_settled([worker], scenario.broker, "pay-1")
    assert run_keys(log) == [SECRET]


def test_a_rejected_write_ends_as_permission_denied_with_the_reason(
    scenario: WorkerScenario,
) -> None:
    scenario.start_worker()
    log = scenario.folder / "payments.jsonl"
    handle = scenario.client.submit(
        SKILL, PAY, {"log": str(log), "key": "k"}, allow_writes=True, request_id="pay-2"
    )
    _parked(scenario.client, "pay-2")
    decision = scenario.client.approvals.reject("pay-2", reason="not today", by="bob")
    assert (decision.outcome, decision.by) == ("rejected", "bob")
    result = handle.result(timeout=60)
    assert not result.success
    assert result.error is not None
    assert result.error.error_type.value == "permission_denied"
    assert result.error.details["reason"] == "approval_rejected"
    assert result.error.details["approval_reason"] == "not today"
    assert runs(log) == []
    assert _events(scenario.client, "pay-2") == ["requested", "awaiting_approval", "rejected"]
    with pytest.raises(ApprovalError, match="already rejected by bob"):
        scenario.client.approve("pay-2")


def test_an_undecided_approval_expires_as_permission_denied(scenario: WorkerScenario) -> None:
    scenario.start_worker(CLEVERAGENTS_APPROVAL_TTL_S="2")
    log = scenario.folder / "payments.jsonl"
    handle = scenario.client.submit(
        SKILL, PAY, {"log": str(log), "key": "k"}, allow_writes=True, request_id="pay-3"
    )
    result = handle.result(timeout=60)
    assert result.error is not None
    assert result.error.details["reason"] == "approval_expired"
    assert result.error.error_type.value == "permission_denied"
    assert runs(log) == []
    assert _events(scenario.client, "pay-3") == ["requested", "awaiting_approval", "expired"]
    expired = cli(scenario.broker, "approvals", "approve", "pay-3")
    assert expired.returncode == 1
    assert "expired unapproved" in expired.stderr
    unknown = cli(scenario.broker, "approvals", "approve", "no-such-id")
    assert unknown.returncode == 1
    assert "no invocation no-such-id awaits approval" in unknown.stderr


def test_a_refused_request_never_reaches_a_person(scenario: WorkerScenario) -> None:
    scenario.start_worker()
    log = scenario.folder / "payments.jsonl"
    # Without --allow-writes: the write gate refuses it; with a wrong argument: validation
    refused = scenario.client.submit(SKILL, PAY, {"log": str(log), "key": "k"}, request_id="pay-4")
    invalid = scenario.client.submit(
        SKILL, PAY, {"log": str(log)}, allow_writes=True, request_id="pay-5"
    )
    first, second = refused.result(timeout=60), invalid.result(timeout=60)
    assert first.error is not None
    assert first.error.error_type.value == "permission_denied"
    assert second.error is not None
    assert second.error.error_type.value == "validation_error"
    assert scenario.client.approvals.pending() == []
    trail = list(scenario.client.approvals.audit(request_id="pay-4"))
    assert [e["event"] for e in trail] == ["requested", "refused"]
    assert trail[1]["gate"] == first.error.details["gate"]
    assert _events(scenario.client, "pay-5") == ["requested", "refused"]


def test_a_deployment_may_ask_for_approval_of_every_write(scenario: WorkerScenario) -> None:
    scenario.start_worker(CLEVERAGENTS_APPROVAL_FOR_WRITES="1")
    log = scenario.folder / "log.jsonl"
    write = scenario.client.submit(SKILL, RECORD, {"log": str(log), "key": "w"}, allow_writes=True)
    read = scenario.client.submit(SKILL, PEEK, {"log": str(log), "key": "r"})
    assert read.result(timeout=60).success  # a read never waits
    _parked(scenario.client, write.request_id)
    scenario.client.approve(write.request_id)
    assert write.result(timeout=60).success
    assert sorted(row["key"] for row in runs(log)) == ["r", "w"]


def _read_all(client: SkillClient, log: Path, n: int) -> float:
    began = time.monotonic()
    handles = [client.submit(SKILL, PEEK, {"log": str(log), "key": f"r{i}"}) for i in range(n)]
    assert all(h.result(timeout=120).success for h in handles)
    return time.monotonic() - began


def test_a_hundred_parked_writes_leave_the_worker_free(scenario: WorkerScenario) -> None:
    scenario.start_worker(concurrency=2)
    log = scenario.folder / "log.jsonl"
    alone = _read_all(scenario.client, log, 20)
    # Given 100 parked writes on a worker of 2 processes
    for i in range(100):
        scenario.client.submit(
            SKILL, PAY, {"log": str(log), "key": f"p{i}"}, allow_writes=True, request_id=f"p-{i}"
        )
    pending = scenario.client.approvals.pending
    wait_until(lambda: len(pending()) == 100, 120, "100 parked", interval=0.5)
    # When 20 reads are sent, they finish about as fast as without them
    beside = _read_all(scenario.client, log, 20)
    print(f"20 reads: {alone:.2f} s alone, {beside:.2f} s beside 100 parked writes")
    assert beside < max(3 * alone, alone + 2.0), (alone, beside)
    assert sum(1 for row in runs(log) if row["key"].startswith("p")) == 0


def test_a_batch_line_that_needs_approval_waits_for_it_and_the_rest_runs(
    scenario: WorkerScenario,
) -> None:
    scenario.start_worker()
    log = scenario.folder / "log.jsonl"
    requests: list[dict[str, Any]] = [
        {"skill": SKILL, "tool": PEEK, "arguments": {"log": str(log), "key": "a"}},
        {"skill": SKILL, "tool": PAY, "arguments": {"log": str(log), "key": "b"},
         "allow_writes": True, "request_id": "line-2"},
        {"skill": SKILL, "tool": PEEK, "arguments": {"log": str(log), "key": "c"}},
    ]  # fmt: skip
    results: list[Any] = []
    run_many = scenario.client.batches.run_many
    runner = threading.Thread(target=lambda: results.extend(run_many(requests)))
    runner.start()
    _parked(scenario.client, "line-2")
    wait_until(lambda: len(runs(log)) == 2, 60, "the other lines to run")
    scenario.client.approve("line-2", by="carol")
    runner.join(90)
    assert [r.success for r in results] == [True, True, True]
    assert run_keys(log)[-1] == "b"
