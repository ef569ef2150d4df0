"""Ride out a Redis restart: retry an operation on connection errors, with backoff.

The first failure of an outage is logged (a warning, at most every ``WARN_EVERY_S``
per process), so that a Redis that cannot be reached is never a silent wait; the
first operation through after it says, once, that Redis answers again.

Why not redis-py's own ``Retry`` with ``ExponentialBackoff`` on the client (issue 43,
weighed and kept):

- The stores use the Celery result backend's client (``stores/factory.py``: one
  pool), so a ``retry=`` on it would also retry every command Celery sends itself,
  under Celery's own ``result_backend_always_retry`` policy: two retry loops, and a
  change to Celery's behaviour this module does not own. A client of their own would
  be a second pool per process.
- ``stores/resp.py``'s ``pipelined`` (several commands in one round trip) and
  ``Script`` take a connection from the pool and read its replies themselves; a
  client's ``Retry`` wraps its own ``execute_command`` and pipelines, and of a bare
  connection only the connecting: a connection lost while those send or read would
  no longer be retried.
- The promise is a time (ride out a restart of up to ``RETRY_FOR_S``), and ``Retry``
  counts attempts: how long those take depends on how each fails (refused at once,
  or a connect timeout), so no count keeps it.
- ``Retry`` has no hook for the first failure of an outage and the first success after
  it, which are this module's one warning and one "answers again" line (shared with
  ``broker/redis/result_backend.py``); a subclass would override ``call_with_retry``,
  redis-py's own loop, for every redis-py release allowed (6.4 to 8).

What is retried is the caller's whole operation (a pipeline, a script, a command),
exactly as with a client's ``Retry`` (which resends a pipeline whole too): a
non-idempotent write whose reply was lost is sent again either way, e.g.
``GuardStore.attempt``'s ``INCR`` may count that delivery twice.
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
