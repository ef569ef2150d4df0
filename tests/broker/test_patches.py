"""The worker's patches of third-party internals (cleveragents/broker/patches/).

Each "upstream still ..." test pins the upstream behaviour a patch works around: it
fails once kombu or Celery changes it, which is the moment to re-check the patch
(and its ``series``) or delete it.
"""

from __future__ import annotations

import logging
import random
import string
from collections.abc import Iterator
from importlib.metadata import version
from typing import Any

import kombu
import pytest
import redis
from celery import Celery
from celery.app import trace
from celery.utils.saferepr import saferepr
from kombu.transport import redis as kombu_redis

from cleveragents.broker import patches
from cleveragents.broker.patches import (
    Patch,
    PatchRefused,
    kombu_connparams,
    result_repr,
    success_log,
)

#: kombu's Redis channel class, untyped: the patch is of its private ``_connparams``.
CHANNEL: Any = kombu_redis.Channel


@pytest.fixture
def restore_patched() -> Iterator[None]:
    """Undo, after the test, any patch it installs in this process."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(CHANNEL, "_connparams", CHANNEL._connparams)
        mp.setattr(trace, "LOG_SUCCESS", trace.LOG_SUCCESS)
        mp.setattr(trace, "saferepr", trace.saferepr)  # type: ignore[attr-defined]
        yield


def _orphaned_channel(redis_url: str) -> tuple[kombu.Connection, Any]:
    # What kombu leaves behind when Redis goes away under a busy worker: a channel
    # whose transport has lost its connection (kombu sets ``client`` to None).
    connection = kombu.Connection(redis_url)
    channel: Any = connection.channel()
    channel.connection.client = None
    return connection, channel


def test_upstream_kombu_still_fails_on_a_redis_channel_whose_connection_is_gone(
    redis_url: str,
) -> None:
    connection, channel = _orphaned_channel(redis_url)
    try:
        with pytest.raises(AttributeError, match="'NoneType' object has no attribute 'hostname'"):
            CHANNEL._connparams(channel)
    finally:
        connection.transport.client = connection
        connection.release()


def test_the_kombu_patch_turns_that_into_a_connection_error_kombu_recovers_from(
    redis_url: str, restore_patched: None
) -> None:
    connection, channel = _orphaned_channel(redis_url)
    try:
        kombu_connparams.install()
        kombu_connparams.install()  # idempotent: wrapped once
        assert kombu_connparams.installed()
        with pytest.raises(redis.ConnectionError):
            CHANNEL._connparams(channel)
        assert redis.ConnectionError in connection.transport.connection_errors
    finally:
        connection.transport.client = connection
        connection.release()
    # A live connection still gets its parameters through the original.
    with kombu.Connection(redis_url) as live:
        fresh: Any = live.channel()
        assert fresh._connparams()["port"] == live.port


def test_upstream_celery_still_logs_a_successful_tasks_return_value(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert not success_log.installed()
    assert _success_line(caplog, "the-return-value") == (
        "Task t.echo[id-1] succeeded in RUNTIMEs: 'the-return-value'"
    )


def test_the_success_log_patch_keeps_the_return_value_out(
    caplog: pytest.LogCaptureFixture, restore_patched: None
) -> None:
    success_log.install()
    assert success_log.installed()
    assert _success_line(caplog, "the-return-value") == "Task t.echo[id-1] succeeded in RUNTIMEs"


def _success_line(caplog: pytest.LogCaptureFixture, value: str) -> str:
    # Celery's own tracer, as a worker's pool process runs it, on a throwaway app.
    app = Celery("patch-test", set_as_current=False)

    @app.task(name="t.echo", ignore_result=True, shared=False)  # type: ignore[untyped-decorator]
    def echo() -> str:
        return value

    with caplog.at_level(logging.INFO, logger="celery.app.trace"):
        traced = trace.build_tracer("t.echo", echo, app=app)("id-1", [], {}, {})
    [record] = [r for r in caplog.records if r.name == "celery.app.trace"]
    return record.getMessage().replace(str(traced.runtime), "RUNTIME")


PAYLOAD = {
    "skill_name": "local/common", "tool_name": "local/noop", "success": True,
    "output_data": {"ok": True, "words": [1, 2.5, None]}, "error": None,
    "duration_ms": 0.06363900047290372, "resource_changes": [],
    "request_id": "b1f8c1c2-6a7e-4c3e-9a55-1b2d3e4f5a6b",
}


def _traced_text(value: Any) -> str:
    """The text Celery's tracer makes of a task's return value (its task-succeeded event's)."""
    app = Celery("patch-test", set_as_current=False)

    @app.task(name="t.give", ignore_result=True, shared=False)  # type: ignore[untyped-decorator]
    def give() -> Any:
        return value

    return str(trace.build_tracer("t.give", give, app=app)("id-1", [], {}, {}).retstr)


def test_upstream_celery_still_writes_a_return_value_with_the_saferepr_of_its_module(
    restore_patched: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert not result_repr.installed()
    seen: list[Any] = []
    def recording(value: Any, maxlen: int) -> str:
        seen.append((value, maxlen))
        return "X"

    monkeypatch.setattr(trace, "saferepr", recording)
    assert _traced_text(PAYLOAD) == "X"
    assert seen == [(PAYLOAD, 1024)]  # resultrepr_maxsize's default


def test_the_result_repr_patch_writes_the_same_text_as_saferepr(restore_patched: None) -> None:
    before = _traced_text(PAYLOAD)
    result_repr.install()
    assert result_repr.installed()
    assert _traced_text(PAYLOAD) == before == saferepr(PAYLOAD, 1024)
    # Whatever the value: plain or escaped strings, big numbers, deep or long containers
    rnd = random.Random(15)

    def value(depth: int = 0) -> Any:
        kind = rnd.randrange(9 if depth < 4 else 6)
        if kind == 0:
            return "".join(rnd.choice(string.printable) for _ in range(rnd.randrange(12)))
        if kind == 1:
            return rnd.randrange(-(10 ** rnd.randrange(1, 25)), 10 ** rnd.randrange(1, 25))
        if kind == 2:
            return rnd.random() * 10 ** rnd.randrange(-5, 20)
        if kind == 3:
            return rnd.choice([None, True, False])
        if kind == 4:
            return "".join(rnd.choice("abc xyz-/:.") for _ in range(rnd.randrange(30)))
        if kind == 5:
            return (float(rnd.randrange(100)), b"bytes", ("a", 1))[rnd.randrange(3)]
        if kind in (6, 7):
            return {"".join(rnd.choice("ab_'") for _ in range(4)): value(depth + 1)
                    for _ in range(rnd.randrange(5))}
        return [value(depth + 1) for _ in range(rnd.randrange(5))]

    for _ in range(5000):
        one, maxlen = value(), rnd.choice([10, 40, 200, 1024])
        assert result_repr.quick_saferepr(one, maxlen) == saferepr(one, maxlen), (one, maxlen)


def test_the_installed_kombu_and_celery_are_the_series_the_patches_were_written_for() -> None:
    for patch in patches.all_patches():
        assert patches.written_for(patch, version(patch.distribution)), patch.name


def _patch(series: str, *, required: bool, installed: list[str]) -> Patch:
    return Patch(
        name="tests.fake_patch",
        distribution="kombu",
        series=series,
        install=lambda: installed.append("yes"),
        without_it="something breaks",
        required=required,
    )


def test_a_patch_for_another_series_is_skipped_with_a_warning() -> None:
    installed: list[str] = []
    notes = patches.apply_all((_patch("0.1", required=False, installed=installed),))
    assert installed == []
    [(level, message)] = notes
    assert level == logging.WARNING
    assert message.startswith("skipped tests.fake_patch was written for kombu 0.1.x")
    assert "without it something breaks" in message


def test_a_required_patch_for_another_series_refuses_the_worker() -> None:
    installed: list[str] = []
    with pytest.raises(PatchRefused, match=r"written for kombu 0\.1\.x"):
        patches.apply_all((_patch("0.1", required=True, installed=installed),))
    assert installed == []


def test_a_patch_for_the_installed_series_is_applied_and_said_so() -> None:
    installed: list[str] = []
    series = ".".join(version("kombu").split(".")[:2])
    notes = patches.apply_all((_patch(series, required=True, installed=installed),))
    assert installed == ["yes"]
    assert notes == [(logging.INFO, f"applied tests.fake_patch (kombu {version('kombu')})")]
