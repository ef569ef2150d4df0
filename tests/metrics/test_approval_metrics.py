"""Approvals in the exporter: counted once by outcome, and the oldest waiting one's age."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from cleveragents.client import SkillClient
from cleveragents.constants import STATE_AWAITING_APPROVAL
from tests.support.procs import Worker, wait_until
from tests.support.prom import scrape, scrape_text, value

pytestmark = pytest.mark.timeout(180)

SKILL, PAY = "test/approvals", "test/send-payment"
COUNTER = "cleveragents_approvals_total"
OLDEST = "cleveragents_approvals_oldest_waiting_seconds"


def test_approvals_are_counted_once_by_outcome_and_the_oldest_wait_is_a_gauge(
    redis_url: str, client: SkillClient, start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    start_worker(redis_url, CLEVERAGENTS_APPROVAL_TTL_S="10")  # parks 3 under load
    log = str(tmp_path / "payments.jsonl")
    handles = {
        key: client.submit(SKILL, PAY, {"log": log, "key": key}, allow_writes=True)
        for key in ("approved", "rejected", "expired")
    }
    for handle in handles.values():
        wait_until(
            lambda h=handle: client.state(h.request_id) == STATE_AWAITING_APPROVAL, 30, "park"
        )
    # While they wait, the oldest one's age grows
    first = value(scrape(redis_url), OLDEST)
    assert first > 0
    client.approve(handles["approved"].request_id)
    client.approvals.reject(handles["rejected"].request_id, reason="no")
    for handle in handles.values():
        handle.result(timeout=60)

    def counted(outcome: str) -> float:
        return value(scrape(redis_url), COUNTER, skill=SKILL, tool=PAY, outcome=outcome)

    wait_until(lambda: counted("expired") == 1, 30, "the expiry to be counted")
    samples = scrape(redis_url)
    for outcome, expected in (("parked", 3), ("approved", 1), ("rejected", 1), ("expired", 1)):
        assert value(samples, COUNTER, skill=SKILL, tool=PAY, outcome=outcome) == expected, outcome
    # None waits any more
    assert value(samples, OLDEST) == 0
    # And the two decisions are counted by the channel they came by (issue 47)
    decisions = "cleveragents_approval_decisions_total"
    assert value(samples, decisions, channel="python", outcome="approved") == 1
    assert value(samples, decisions, channel="python", outcome="rejected") == 1


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_promtool_accepts_the_approval_series(
    redis_url: str, client: SkillClient, start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    start_worker(redis_url)
    handle = client.submit(
        SKILL, PAY, {"log": str(tmp_path / "p.jsonl"), "key": "k"}, allow_writes=True
    )
    wait_until(lambda: client.state(handle.request_id) == STATE_AWAITING_APPROVAL, 30, "park")
    wait_until(lambda: f"{COUNTER}{{" in scrape_text(redis_url), 30, "the count to be flushed")
    checked = subprocess.run(
        ["promtool", "check", "metrics"], input=scrape_text(redis_url), capture_output=True,
        text=True, timeout=30,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
