"""What `approvals list` and `audit` print, read by people and by scripts (issue 48, item 10)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import pytest
from click.testing import CliRunner

from cleveragents.approvals.model import Parked
from cleveragents.cli import approvals_cmd


class _Desk:
    def __init__(self, waiting: list[Parked], events: list[dict[str, str]]) -> None:
        self.waiting, self.events = waiting, events

    def pending(self) -> list[Parked]:
        return self.waiting

    def audit(self, **_: Any) -> list[dict[str, str]]:
        return self.events


def _client(desk: _Desk) -> Any:
    @contextmanager
    def opened(_settings: Any) -> Any:
        yield type("Client", (), {"approvals": desk})()

    return opened


LONG_TOOL = "acme-payments-department/send-international-wire-transfer-with-review"
ORIGIN = "gen123456@build-agent-number-42.eu-west-1.compute.internal"


def test_approvals_list_through_a_pipe_prints_every_column_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parked = Parked("5c1f0e9a-0d7e-4a53-9a55-4f0e2b6c7d11", "acme/payments", LONG_TOOL,
                    "0" * 64, {}, ORIGIN, asked_at=1.0, expires_at=2.0)  # fmt: skip
    monkeypatch.setattr(approvals_cmd, "cli_client", _client(_Desk([parked], [])))
    shown = CliRunner().invoke(approvals_cmd.approvals, ["list"])
    assert shown.exit_code == 0, shown.output
    assert LONG_TOOL in shown.output
    assert ORIGIN in shown.output
    assert parked.request_id in shown.output


def test_audit_quotes_a_value_with_spaces(monkeypatch: pytest.MonkeyPatch) -> None:
    event = {"at": "2026-12-06T20:00:00.000Z", "event": "rejected", "request_id": "pay-1",
             "skill": "acme/payments", "tool": "acme/pay", "by": "alice",
             "reason": "not today"}  # fmt: skip
    monkeypatch.setattr(approvals_cmd, "cli_client", _client(_Desk([], [event])))
    shown = CliRunner().invoke(approvals_cmd.audit, [])
    assert shown.exit_code == 0, shown.output
    assert 'by=alice reason="not today"' in shown.output
