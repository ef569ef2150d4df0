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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cleveragents.approvals.model import ApprovalError
from cleveragents.client import SkillClient
from cleveragents.constants import STATE_AWAITING_APPROVAL
from tests.conftest import Broker
from tests.support.procs import REPO, Worker, wait_until

pytestmark = pytest.mark.timeout(240)

SKILL, PAY, RECORD, PEEK = "test/approvals", "test/send-payment", "test/record", "test/peek"
#: An argument value that must never reach the audit trail.
SECRET = "acct-7731-s3cret"


def _cli(broker: Broker, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**_clean_env(), **broker.env, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "cleveragents", *args],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def _clean_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("CLEVERAGENTS_")}


def _lines(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]


def _parked(client: SkillClient, request_id: str) -> None:
    wait_until(
        lambda: client.state(request_id) == STATE_AWAITING_APPROVAL, 60, f"{request_id} to park"
    )


def _events(client: SkillClient, request_id: str) -> list[str]:
    return [e["event"] for e in client.approvals.audit(request_id=request_id)]


def test_an_approved_write_runs_once_and_submit_wait_returns_its_result(
    broker: Broker,
    broker_client: SkillClient,
    start_worker: Callable[..., Worker],
    tmp_path: Path,
) -> None:
    worker = start_worker(broker)
    log = tmp_path / "payments.jsonl"
    args = json.dumps({"log": str(log), "key": SECRET})
    # Given a write that needs approval, submitted with --allow-writes and --wait
    waiting = subprocess.Popen(
        [sys.executable, "-m", "cleveragents", "submit", SKILL, PAY, "--args", args,
         "--allow-writes", "--request-id", "pay-1", "--wait", "--timeout", "60", "--json"],
        env={**_clean_env(), **broker.env, "PYTHONPATH": str(REPO)}, cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.extend(iter(waiting.stderr.readline, "")))  # type: ignore[union-attr]
    reader.start()
    try:
        _parked(broker_client, "pay-1")
        # Then it is awaiting approval, listed with its skill and tool, and has not run
        shown = json.loads(_cli(broker, "result", "pay-1", "--json").stdout)
        assert shown["state"] == "awaiting_approval"
        assert shown["request_id"] == "pay-1"
        listed = [
            json.loads(line)
            for line in _cli(broker, "approvals", "list", "--json").stdout.splitlines()
        ]
        assert [(x["request_id"], x["skill"], x["tool"]) for x in listed] == [("pay-1", SKILL, PAY)]
        show = json.loads(_cli(broker, "approvals", "show", "pay-1", "--json").stdout)
        assert show["arguments"] == {"log": str(log), "key": SECRET}
        assert _lines(log) == []
        wait_until(lambda: any("approval" in line for line in said), 30, "submit to say it waits")
        # And the worker's log says once that it waits, and how to approve it
        parked_lines = [
            line
            for line in worker.log.read_text(encoding="utf-8").splitlines()
            if f"pay-1 ({SKILL} / {PAY}) waits for approval" in line
        ]
        assert len(parked_lines) == 1, parked_lines
        assert parked_lines[0].endswith("cleveragents approvals approve pay-1")
        # When a person approves it
        approved = _cli(broker, "approvals", "approve", "pay-1", "--by", "alice", "--reason", "ok")
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
    assert [row["key"] for row in _lines(log)] == [SECRET]  # it ran once
    # And the audit trail tells the story in order, with who approved, and no argument value
    trail = list(broker_client.approvals.audit(request_id="pay-1"))
    assert [e["event"] for e in trail] == [
        "requested", "awaiting_approval", "approved", "started", "succeeded",
    ]  # fmt: skip
    assert trail[2]["by"] == "alice"
    assert all(e["skill"] == SKILL and e["tool"] == PAY and e["at"] for e in trail)
    assert SECRET not in json.dumps(trail)
    assert str(log) not in json.dumps(trail)
    # And approving it again changes nothing, in one line
    again = _cli(broker, "approvals", "approve", "pay-1")
    assert again.returncode == 1
    assert again.stderr.strip().splitlines() == [
        "error: invocation pay-1 was already approved by alice (ok); nothing was changed"
    ]
    assert _cli(broker, "approvals", "reject", "pay-1", "--reason", "no").returncode == 1
    time.sleep(0.5)
    assert len(_lines(log)) == 1


def test_a_rejected_write_ends_as_permission_denied_with_the_reason(
    broker: Broker,
    broker_client: SkillClient,
    start_worker: Callable[..., Worker],
    tmp_path: Path,
) -> None:
    start_worker(broker)
    log = tmp_path / "payments.jsonl"
    handle = broker_client.submit(
        SKILL, PAY, {"log": str(log), "key": "k"}, allow_writes=True, request_id="pay-2"
    )
    _parked(broker_client, "pay-2")
    decision = broker_client.approvals.reject("pay-2", reason="not today", by="bob")
    assert (decision.outcome, decision.by) == ("rejected", "bob")
    result = handle.result(timeout=60)
    assert not result.success
    assert result.error is not None
    assert result.error.error_type.value == "permission_denied"
    assert result.error.details["reason"] == "approval_rejected"
    assert result.error.details["approval_reason"] == "not today"
    assert _lines(log) == []
    assert _events(broker_client, "pay-2") == ["requested", "awaiting_approval", "rejected"]
    with pytest.raises(ApprovalError, match="already rejected by bob"):
        broker_client.approve("pay-2")


def test_an_undecided_approval_expires_as_permission_denied(
    broker: Broker,
    broker_client: SkillClient,
    start_worker: Callable[..., Worker],
    tmp_path: Path,
) -> None:
    start_worker(broker, CLEVERAGENTS_APPROVAL_TTL_S="2")
    log = tmp_path / "payments.jsonl"
    handle = broker_client.submit(
        SKILL, PAY, {"log": str(log), "key": "k"}, allow_writes=True, request_id="pay-3"
    )
    result = handle.result(timeout=60)
    assert result.error is not None
    assert result.error.details["reason"] == "approval_expired"
    assert result.error.error_type.value == "permission_denied"
    assert _lines(log) == []
    assert _events(broker_client, "pay-3") == ["requested", "awaiting_approval", "expired"]
    expired = _cli(broker, "approvals", "approve", "pay-3")
    assert expired.returncode == 1
    assert "expired unapproved" in expired.stderr
    unknown = _cli(broker, "approvals", "approve", "no-such-id")
    assert unknown.returncode == 1
    assert "no invocation no-such-id awaits approval" in unknown.stderr


def test_a_refused_request_never_reaches_a_person(
    broker: Broker,
    broker_client: SkillClient,
    start_worker: Callable[..., Worker],
    tmp_path: Path,
) -> None:
    start_worker(broker)
    log = tmp_path / "payments.jsonl"
    # Without --allow-writes: the write gate refuses it; with a wrong argument: validation
    refused = broker_client.submit(SKILL, PAY, {"log": str(log), "key": "k"}, request_id="pay-4")
    invalid = broker_client.submit(
        SKILL, PAY, {"log": str(log)}, allow_writes=True, request_id="pay-5"
    )
    first, second = refused.result(timeout=60), invalid.result(timeout=60)
    assert first.error is not None
    assert first.error.error_type.value == "permission_denied"
    assert second.error is not None
    assert second.error.error_type.value == "validation_error"
    assert broker_client.approvals.pending() == []
    trail = list(broker_client.approvals.audit(request_id="pay-4"))
    assert [e["event"] for e in trail] == ["requested", "refused"]
    assert trail[1]["gate"] == first.error.details["gate"]
    assert _events(broker_client, "pay-5") == ["requested", "refused"]


def test_a_deployment_may_ask_for_approval_of_every_write(
    broker: Broker,
    broker_client: SkillClient,
    start_worker: Callable[..., Worker],
    tmp_path: Path,
) -> None:
    start_worker(broker, CLEVERAGENTS_APPROVAL_FOR_WRITES="1")
    log = tmp_path / "log.jsonl"
    write = broker_client.submit(SKILL, RECORD, {"log": str(log), "key": "w"}, allow_writes=True)
    read = broker_client.submit(SKILL, PEEK, {"log": str(log), "key": "r"})
    assert read.result(timeout=60).success  # a read never waits
    _parked(broker_client, write.request_id)
    broker_client.approve(write.request_id)
    assert write.result(timeout=60).success
    assert sorted(row["key"] for row in _lines(log)) == ["r", "w"]


def _read_all(client: SkillClient, log: Path, n: int) -> float:
    began = time.monotonic()
    handles = [client.submit(SKILL, PEEK, {"log": str(log), "key": f"r{i}"}) for i in range(n)]
    assert all(h.result(timeout=120).success for h in handles)
    return time.monotonic() - began


def test_a_hundred_parked_writes_leave_the_worker_free(
    broker: Broker,
    broker_client: SkillClient,
    start_worker: Callable[..., Worker],
    tmp_path: Path,
) -> None:
    start_worker(broker, concurrency=2)
    log = tmp_path / "log.jsonl"
    alone = _read_all(broker_client, log, 20)
    # Given 100 parked writes on a worker of 2 processes
    for i in range(100):
        broker_client.submit(
            SKILL, PAY, {"log": str(log), "key": f"p{i}"}, allow_writes=True, request_id=f"p-{i}"
        )
    pending = broker_client.approvals.pending
    wait_until(lambda: len(pending()) == 100, 120, "100 parked", interval=0.5)
    # When 20 reads are sent, they finish about as fast as without them
    beside = _read_all(broker_client, log, 20)
    print(f"20 reads: {alone:.2f} s alone, {beside:.2f} s beside 100 parked writes")
    assert beside < max(3 * alone, alone + 2.0), (alone, beside)
    assert sum(1 for row in _lines(log) if row["key"].startswith("p")) == 0


def test_a_batch_line_that_needs_approval_waits_for_it_and_the_rest_runs(
    broker: Broker,
    broker_client: SkillClient,
    start_worker: Callable[..., Worker],
    tmp_path: Path,
) -> None:
    start_worker(broker)
    log = tmp_path / "log.jsonl"
    requests: list[dict[str, Any]] = [
        {"skill": SKILL, "tool": PEEK, "arguments": {"log": str(log), "key": "a"}},
        {"skill": SKILL, "tool": PAY, "arguments": {"log": str(log), "key": "b"},
         "allow_writes": True, "request_id": "line-2"},
        {"skill": SKILL, "tool": PEEK, "arguments": {"log": str(log), "key": "c"}},
    ]  # fmt: skip
    results: list[Any] = []
    run_many = broker_client.batches.run_many
    runner = threading.Thread(target=lambda: results.extend(run_many(requests)))
    runner.start()
    _parked(broker_client, "line-2")
    wait_until(lambda: len(_lines(log)) == 2, 60, "the other lines to run")
    broker_client.approve("line-2", by="carol")
    runner.join(90)
    assert [r.success for r in results] == [True, True, True]
    assert [row["key"] for row in _lines(log)][-1] == "b"
