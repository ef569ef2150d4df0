"""Ride out a Redis restart: retry an operation on connection errors, with backoff."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import redis

__all__ = ["RETRY_FOR_S", "retrying"]

T = TypeVar("T")

#: How long an operation keeps retrying before the error is raised.
RETRY_FOR_S = 120.0
_TRANSIENT = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)


def retrying(operation: Callable[[], T], *, for_s: float = RETRY_FOR_S) -> T:
    """Call ``operation``; on a Redis connection error wait (0.1 s, doubling to 2 s) and retry."""
    deadline = time.monotonic() + for_s
    pause = 0.1
    while True:
        try:
            return operation()
        except _TRANSIENT:
            if time.monotonic() + pause > deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 2, 2.0)
