"""Fixtures of the deployment tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.composefile import RedisWithUsers


@pytest.fixture
def server() -> Iterator[RedisWithUsers]:
    """A private redis-server with the compose users: no other worker takes a message."""
    started = RedisWithUsers().start()
    try:
        yield started
    finally:
        started.stop()
