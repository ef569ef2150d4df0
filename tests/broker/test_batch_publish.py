"""Batch publishing on this project's Redis transport follows kombu's own rule (issue 42, item 9).

kombu refuses to batch publishes into one pipeline when the connection retries a
command (``retry_on_timeout``, ``retry_on_error``, a ``retry``): a pipeline sent again
publishes every message in it twice. kombu 5.7's own Redis integration suite found
this project's transport batching regardless.
"""

from __future__ import annotations

from typing import Any

import pytest
from kombu import Connection

from cleveragents.broker.celery_settings import REDIS_TRANSPORT, celery_settings
from cleveragents.settings import Settings

#: Transport options: none, the time-out retry, and retries on other errors.
OPTIONS: list[dict[str, Any]] = [
    {},
    {"retry_on_timeout": True},
    {"retry_on_timeout": False},
    {"retry_on_error": [TimeoutError]},
]


def _batches(url: str, transport: str, options: dict[str, Any]) -> tuple[bool, bool]:
    """What the channel and the transport say of batching, for a connection with ``options``."""
    connection = Connection(url, transport=transport, transport_options=options)
    transport_of: Any = connection.transport  # kombu 5.7's property, not in its stubs
    try:
        channel: Any = connection.channel()
        try:
            return (
                bool(channel.supports_batch_publish),
                bool(transport_of.supports_batch_publish),
            )
        finally:
            channel.close()
    finally:
        connection.release()


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(o) or "none")
def test_the_transport_batches_exactly_when_kombus_own_would(
    redis_url: str, options: dict[str, Any]
) -> None:
    ours = _batches(redis_url, REDIS_TRANSPORT, options)
    assert ours == _batches(redis_url, "redis", options)
    # (Whatever kombu says otherwise: with retry_on_error its channel batches and its
    # transport does not, since kombu passes that option to no connection.)
    if options.get("retry_on_timeout"):
        assert ours == (False, False)
    elif not options or options == {"retry_on_timeout": False}:
        assert ours == (True, True)


def test_a_connection_retrying_on_time_out_does_not_batch(redis_url: str) -> None:
    # Given the worker's options (redis-py sends a timed-out command again)
    options = celery_settings(Settings.from_env({"CLEVERAGENTS_BROKER_URL": redis_url}))[
        "broker_transport_options"
    ]
    assert options["retry_on_timeout"] is True
    # Then its channel publishes one message a pipeline
    assert _batches(redis_url, REDIS_TRANSPORT, options) == (False, False)


def test_a_producers_connection_does_not_retry_and_so_batches(redis_url: str) -> None:
    # A SkillClient's options: a message and its task-sent event in one pipeline
    # (tests/client/test_client_publish.py), sent once by redis-py
    options = celery_settings(
        Settings.from_env({"CLEVERAGENTS_BROKER_URL": redis_url}), producer=True
    )["broker_transport_options"]
    assert options["retry_on_timeout"] is False
    assert _batches(redis_url, REDIS_TRANSPORT, options) == (True, True)
