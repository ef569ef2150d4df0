"""Approvals on the embedded default: the local user decides, from another terminal, and
the audit trail is a private file in the home."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.embedded.test_embedded_concurrency import cli_env, processes_using, start_cli
from tests.support.procs import FIXTURE_SKILLS, wait_until

pytestmark = pytest.mark.timeout(180)

SKILL, PAY = "test/approvals", "test/send-payment"


@pytest.fixture
def work(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "work"
    folder.mkdir()
    yield folder
    for pid in processes_using(folder):
        os.kill(pid, signal.SIGKILL)


def _env(work: Path, **extra: str) -> dict[str, str]:
    return cli_env(
        CLEVERAGENTS_HOME=str(work / "home"), CLEVERAGENTS_CATALOGUE=str(FIXTURE_SKILLS), **extra
    )


def _run(work: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    proc = start_cli(*args, cwd=work, env=_env(work, **extra))
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _submit(
    work: Path, request_id: str, log: Path, **extra: str
) -> tuple[subprocess.Popen[str], list[str]]:
    args = json.dumps({"log": str(log), "key": request_id})
    proc = start_cli(
        "submit", SKILL, PAY, "--args", args, "--allow-writes", "--request-id", request_id,
        "--wait", "--json", cwd=work, env=_env(work, **extra),
    )  # fmt: skip
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.extend(iter(proc.stderr.readline, "")))  # type: ignore[union-attr]
    reader.daemon = True
    reader.start()
    wait_until(lambda: any("approval" in line for line in said), 60, "submit to say it waits")
    return proc, said


def test_the_local_user_approves_from_another_terminal(work: Path) -> None:
    log = work / "payments.jsonl"
    waiting, said = _submit(work, "pay-1", log)
    listed = _run(work, "approvals", "list", "--json")
    assert [json.loads(line)["request_id"] for line in listed.stdout.splitlines()] == ["pay-1"]
    assert not log.exists()
    # A long id is shown whole on a narrow terminal: it is copied into `approve`
    long_id = "payment-2026-12-05-0001-for-account-7731"
    _submit(work, long_id, log)
    table = _run(work, "approvals", "list", COLUMNS="80").stdout
    assert long_id in table, table
    assert _run(work, "approvals", "reject", long_id, "--reason", "a test").returncode == 0
    approved = _run(work, "approvals", "approve", "pay-1")
    assert approved.returncode == 0, approved.stderr
    out, _ = waiting.communicate(timeout=60)
    assert waiting.returncode == 0, "".join(said)
    assert json.loads(out)["success"] is True
    assert len(log.read_text(encoding="utf-8").splitlines()) == 1
    # The trail is in the home's server, which only its user reaches; `audit` reads it
    # in order, and it is whole
    assert _run(work, "audit", "--verify").returncode == 0
    events = [json.loads(line) for line in _run(work, "audit", "--json").stdout.splitlines()]
    events = [e for e in events if e["request_id"] == "pay-1"]
    assert [e["event"] for e in events] == [
        "requested", "awaiting_approval", "approved", "started", "succeeded",
    ]  # fmt: skip
    assert events[2]["by"]  # the local user
    assert str(log) not in json.dumps(events)
    none = _run(work, "audit", "--request-id", "never-sent")
    assert none.stdout == ""
    assert none.stderr.strip() == "no write events of never-sent in the audit trail"


def test_a_rejection_and_an_expiry_end_as_permission_denied(work: Path) -> None:
    log = work / "payments.jsonl"
    waiting, _ = _submit(work, "pay-2", log)
    rejected = _run(work, "approvals", "reject", "pay-2", "--reason", "not today")
    assert rejected.returncode == 0, rejected.stderr
    out, _ = waiting.communicate(timeout=60)
    error = json.loads(out)["error"]
    assert (error["error_type"], error["details"]["reason"]) == (
        "permission_denied",
        "approval_rejected",
    )
    assert error["details"]["approval_reason"] == "not today"
    # An undecided one expires (a short time to live, read by the local worker)
    expiring, _ = _submit(work, "pay-3", log, CLEVERAGENTS_APPROVAL_TTL_S="2")
    out, _ = expiring.communicate(timeout=60)
    assert json.loads(out)["error"]["details"]["reason"] == "approval_expired"
    assert not log.exists()


def test_an_approval_with_no_local_worker_says_what_runs_it_and_result_says_approved(
    work: Path,
) -> None:
    # Given a call parked by `submit --wait`, which then stopped waiting (Ctrl-C), so
    # that no local worker serves the home (issue 48, item 5)
    log = work / "payments.jsonl"
    waiting, _ = _submit(work, "pay-5", log)
    waiting.send_signal(signal.SIGINT)
    waiting.communicate(timeout=60)
    # When it is approved
    approved = _run(work, "approvals", "approve", "pay-5")
    # Then `approve` says what runs it, not that it runs now
    assert approved.returncode == 0, approved.stderr
    last = approved.stdout.strip().splitlines()[-1]
    assert "it runs when a worker next serves this home, and none does now" in last, last
    assert "`cleveragents result pay-5 --wait`" in last
    # And `result` says it was approved and waits to run (not that it waits for approval)
    shown = _run(work, "result", "pay-5")
    assert shown.returncode == 1
    assert shown.stderr.startswith("pay-5: approved by "), shown.stderr
    assert ", waiting to run (no worker serves this home now" in shown.stderr
    assert json.loads(_run(work, "result", "pay-5", "--json").stdout)["state"] == "approved"
    assert not log.exists()
    # And `result --wait` starts the local worker, which runs it once
    ran = _run(work, "result", "pay-5", "--wait", "--json")
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["success"] is True
    assert len(log.read_text(encoding="utf-8").splitlines()) == 1
