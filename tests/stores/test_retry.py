"""Riding out a Redis restart (``stores/redis_retry.py``): retried, and said once, not silently."""

from __future__ import annotations

import logging

import pytest
import redis

from cleveragents.stores import redis_retry as retry
from cleveragents.stores.redis_retry import retrying


def _flaky(failures: int) -> tuple[list[int], object]:
    calls: list[int] = []

    def operation() -> str:
        calls.append(1)
        if len(calls) <= failures:
            raise redis.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused.")
        return "done"

    return calls, operation


def test_a_connection_error_is_retried_and_said_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(retry, "_warned_at", None)
    calls, operation = _flaky(3)
    with caplog.at_level(logging.WARNING, logger="cleveragents.stores.redis_retry"):
        assert retrying(operation, for_s=10) == "done"  # type: ignore[arg-type]
    assert len(calls) == 4
    [record] = caplog.records
    assert "Connection refused" in record.getMessage()
    assert "retrying for up to 10 s" in record.getMessage()


def test_the_error_is_raised_once_the_time_is_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retry, "_warned_at", None)
    _, operation = _flaky(1000)
    with pytest.raises(redis.ConnectionError):
        retrying(operation, for_s=0.3)  # type: ignore[arg-type]


def test_an_outage_is_said_at_most_every_warn_every_s(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(retry, "_warned_at", None)
    with caplog.at_level(logging.WARNING, logger="cleveragents.stores.redis_retry"):
        for _ in range(5):  # many operations of one worker meet the same outage
            _, operation = _flaky(1)
            retrying(operation, for_s=10)  # type: ignore[arg-type]
    assert len(caplog.records) == 1


def test_the_end_of_an_outage_is_said_once_after_its_warning(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(retry, "_warned_at", None)
    monkeypatch.setattr(retry, "_said_away", False)
    with caplog.at_level(logging.INFO, logger="cleveragents.stores.redis_retry"):
        for _ in range(3):  # operations of one process meet one outage, and get through
            _, operation = _flaky(1)
            retrying(operation, for_s=10)  # type: ignore[arg-type]
    said = [(r.levelname, r.getMessage().split(" (")[0]) for r in caplog.records]
    assert said == [("WARNING", "Redis did not answer"), ("INFO", "Redis answers again")]
