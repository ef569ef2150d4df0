"""Ride out a Redis restart: retry an operation on connection errors, with backoff.

The first failure of an outage is logged (a warning, at most every ``WARN_EVERY_S``
per process), so that a Redis that cannot be reached is never a silent wait; the
first operation through after it says, once, that Redis answers again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import redis

__all__ = ["RETRY_FOR_S", "WARN_EVERY_S", "retrying", "say_away", "say_back"]

T = TypeVar("T")

log = logging.getLogger("cleveragents.stores.redis_retry")

#: How long an operation keeps retrying before the error is raised.
RETRY_FOR_S = 120.0
#: An outage is logged at most this often per process (every operation meets it).
WARN_EVERY_S = 10.0
_TRANSIENT = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)
_warned_at: float | None = None
_said_away = False  # an outage was said and its end not yet


def say_away(exc: Exception, for_s: float = RETRY_FOR_S) -> None:
    """Say that Redis did not answer: once an outage, at most every ``WARN_EVERY_S``."""
    global _warned_at, _said_away
    now = time.monotonic()
    if _warned_at is not None and now - _warned_at < WARN_EVERY_S:
        return
    _warned_at, _said_away = now, True
    log.warning("Redis did not answer (%s); retrying for up to %g s", exc, for_s)


def retrying(operation: Callable[[], T], *, for_s: float = RETRY_FOR_S) -> T:
    """Call ``operation``; on a Redis connection error wait (0.1 s, doubling to 2 s) and retry."""
    deadline = time.monotonic() + for_s
    pause = 0.1
    while True:
        try:
            value = operation()
        except _TRANSIENT as exc:
            if time.monotonic() + pause > deadline:
                raise
            if pause == 0.1:  # the first failure of this operation
                say_away(exc, for_s)
            time.sleep(pause)
            pause = min(pause * 2, 2.0)
            continue
        if pause > 0.1:  # this operation met the outage: say it is over, if it was said
            say_back()
        return value


def say_back() -> None:
    """Say that Redis answers again, once, if this process said it did not."""
    global _said_away
    if _said_away and _warned_at is not None:
        log.info("Redis answers again (%.1f s after the warning)", time.monotonic() - _warned_at)
    _said_away = False
