"""The worker's patches of third-party internals (worker/patches/).

Each "upstream still ..." test pins the upstream behaviour a patch works around: it
fails once kombu or Celery changes it, which is the moment to re-check the patch
(and its ``series``) or delete it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from importlib.metadata import version
from typing import Any

import kombu
import pytest
import redis
from celery import Celery
from celery.app import trace
from kombu.transport import redis as kombu_redis

from worker import patches
from worker.patches import Patch, PatchRefused, kombu_connparams, success_log

#: kombu's Redis channel class, untyped: the patch is of its private ``_connparams``.
CHANNEL: Any = kombu_redis.Channel


@pytest.fixture
def restore_patched() -> Iterator[None]:
    """Undo, after the test, any patch it installs in this process."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(CHANNEL, "_connparams", CHANNEL._connparams)
        mp.setattr(trace, "LOG_SUCCESS", trace.LOG_SUCCESS)
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
