"""``result ID`` of an invocation between two attempts says which attempt failed and
when the next is due (issue 48, item 10), on the result backend a worker stores it in."""

from __future__ import annotations

import calendar
import json
import time

import pytest
from celery import states
from click.testing import CliRunner

from cleveragents.cli.submit_cmd import result
from cleveragents.client import SkillClient
from cleveragents.messages import retry_pending


def test_result_during_a_retry_names_the_attempt_and_when_the_next_is_due(
    client: SkillClient, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given attempt 1 stored as failed, attempt 2 due 30 s after 2026-12-06T20:00:00Z
    now = float(calendar.timegm(time.strptime("2026-12-06T20:00:00", "%Y-%m-%dT%H:%M:%S")))
    pending = retry_pending(1, "tool_execution_failure", 30.0, now=now)
    client.app.backend.store_result("r-retrying", pending, states.RETRY)
    monkeypatch.setenv("CLEVERAGENTS_BROKER_URL", redis_url)
    # When `result` reads it, for people and as JSON
    said = CliRunner().invoke(result, ["r-retrying"])
    shown = CliRunner().invoke(result, ["r-retrying", "--json"])
    # Then both say which attempt failed and when the next is due
    assert said.exit_code == 1
    assert said.output.strip() == (
        "r-retrying: retrying (no result yet): attempt 1 failed (tool_execution_failure); "
        "attempt 2 is due at 2026-12-06T20:00:30Z"
    )
    assert json.loads(shown.stdout) == {
        "request_id": "r-retrying",
        "state": "RETRY",
        "retry": "attempt 1 failed (tool_execution_failure); attempt 2 is due at "
        "2026-12-06T20:00:30Z",
        "next_attempt_at": "2026-12-06T20:00:30Z",
    }
