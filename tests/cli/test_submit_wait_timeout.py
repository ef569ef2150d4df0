"""How long ``submit --wait`` waits (issue 48, item 4): ``--wait-timeout`` bounds the wait
alone; ``--timeout`` is the invocation's, and the wait allows a minute of queueing on top."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from cleveragents.cli import submit_cmd
from cleveragents.cli.render import CliFailure


class _Client:
    """Builds and sends a request, and never has its result."""

    def __enter__(self) -> _Client:
        return self

    def __exit__(self, *_: Any) -> None:
        return None

    def build_request(self, skill: str, tool: str, arguments: Any, **kw: Any) -> Any:
        return type("Request", (), {"request_id": "r-wait", "allow_writes": False, **kw})()

    def send(self, request: Any) -> None:
        return None


def _waits(monkeypatch: pytest.MonkeyPatch, *args: str) -> list[float | None]:
    """The limit ``submit`` waits with, given ``args``."""
    limits: list[float | None] = []

    def wait(_client: Any, _request_id: str, limit: float | None, *_: Any) -> Any:
        limits.append(limit)
        raise CliFailure("gave up", exit_code=1)

    @contextlib.contextmanager
    def no_worker(_settings: Any) -> Iterator[None]:
        yield None

    monkeypatch.setattr(submit_cmd, "cli_client", lambda _settings: _Client())
    monkeypatch.setattr(submit_cmd, "local_worker_if_embedded", no_worker)
    monkeypatch.setattr(submit_cmd, "_wait", wait)
    ran = CliRunner().invoke(submit_cmd.submit, ["local/s", "local/t", *args])
    assert ran.exit_code == 1, ran.output
    return limits


def test_wait_timeout_bounds_the_wait_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _waits(monkeypatch, "--wait", "--timeout", "15", "--wait-timeout", "15") == [15]


def test_wait_timeout_implies_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _waits(monkeypatch, "--wait-timeout", "2") == [2]


def test_timeout_alone_waits_a_minute_of_queueing_beyond_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _waits(monkeypatch, "--wait", "--timeout", "15") == [75]
