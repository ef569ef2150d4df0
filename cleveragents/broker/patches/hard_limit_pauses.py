"""The hard time limit counts the time a task ran, not a pause of its worker (Celery 5.7).

Celery's prefork pool (``AsynPool``) ends a pool process at its task's hard time
limit with a timer on the main process's event loop. The timer counts on the
monotonic clock, which keeps counting while the worker is stopped (``SIGSTOP``, a
frozen container or virtual machine): a worker frozen past a task's limit ended
that task's pool process the moment it resumed, and its invocation was reported
as a time-out although its tool had run for a fraction of it.

Here ``AsynPool._on_hard_timeout`` first asks the main process's pause clock
(``cleveragents/runtime/pauses.py``) how long the process was paused since the task
was accepted (billiard's ``_time_accepted``, on the same monotonic clock), and sets
the timer again for that long where it was; the pool process's own deadline does
the same for the tool (``runtime/deadline.py``). A limit that comes due without a
pause ends the process as before. Without this patch a paused worker's pauses
count against the hard limit, as in Celery.
"""

from __future__ import annotations

from typing import Any

from celery.concurrency import asynpool
from kombu.asynchronous import get_event_loop

from cleveragents.broker.patches.patch import Patch
from cleveragents.runtime.pauses import pause_clock

__all__ = ["PATCH", "install", "installed"]

#: The pool class (untyped here: celery-types does not list its private methods).
_POOL: Any = asynpool.AsynPool
_ORIGINAL = _POOL._on_hard_timeout


def _on_hard_timeout(self: Any, job: int) -> None:
    """Celery's hard time-out of ``job``, unless its worker was paused since it started."""
    result = self._cache.get(job)
    accepted = getattr(result, "_time_accepted", None)
    hub = get_event_loop()
    if result is not None and accepted and hub is not None:
        granted = getattr(result, "_cleveragents_paused_s", 0.0)
        paused = pause_clock().paused_since(accepted) - granted
        if paused > 0:  # that time was not the task's: its limit moves on by as much
            result._cleveragents_paused_s = granted + paused
            self._tref_for_id[job] = hub.call_later(paused, self._on_hard_timeout, job)
            return
    _ORIGINAL(self, job)


def install() -> None:
    """Count pauses out of the hard time limit (idempotent); starts the pause clock."""
    pause_clock()
    _POOL._on_hard_timeout = _on_hard_timeout


def installed() -> bool:
    """True once ``install`` has run in this process."""
    return bool(_POOL._on_hard_timeout is _on_hard_timeout)


PATCH = Patch.for_part(__name__, "hard-limit-pauses-patch", install)
