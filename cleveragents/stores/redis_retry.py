"""Ride out a Redis restart: retry an operation on connection errors, with backoff.

The first failure of an outage is logged (a warning, at most every ``WARN_EVERY_S``
per process), so that a Redis that cannot be reached is never a silent wait.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import redis

__all__ = ["RETRY_FOR_S", "WARN_EVERY_S", "retrying"]

T = TypeVar("T")

log = logging.getLogger("cleveragents.stores.redis_retry")

#: How long an operation keeps retrying before the error is raised.
RETRY_FOR_S = 120.0
#: An outage is logged at most this often per process (every operation meets it).
WARN_EVERY_S = 10.0
_TRANSIENT = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)
_warned_at: float | None = None


def _say(exc: Exception, for_s: float) -> None:
    global _warned_at
    now = time.monotonic()
    if _warned_at is not None and now - _warned_at < WARN_EVERY_S:
        return
    _warned_at = now
    log.warning("Redis did not answer (%s); retrying for up to %g s", exc, for_s)


def retrying(operation: Callable[[], T], *, for_s: float = RETRY_FOR_S) -> T:
    """Call ``operation``; on a Redis connection error wait (0.1 s, doubling to 2 s) and retry."""
    deadline = time.monotonic() + for_s
    pause = 0.1
    while True:
        try:
            return operation()
        except _TRANSIENT as exc:
            if time.monotonic() + pause > deadline:
                raise
            if pause == 0.1:  # the first failure of this operation
                _say(exc, for_s)
            time.sleep(pause)
            pause = min(pause * 2, 2.0)
