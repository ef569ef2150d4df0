"""How long this process was paused, so that a time-out counts a tool's running time.

A worker can be frozen whole: ``SIGSTOP`` (or ``kill -STOP`` of its process group), a
frozen container (``docker pause``, the cgroup freezer), a virtual machine halted for
a snapshot or a live migration. The monotonic clock that deadlines are set on keeps
counting meanwhile, so a tool that had run 10 s of its 30 s would be stopped the
moment its worker resumed, and reported as timed out: the worker blaming the tool
for its own pause.

Nothing in the kernel tells a process how long it was stopped, so each process that
runs deadlines keeps a ticker thread: it wakes every ``TICK_S``; a wake-up
``LATE_S`` or more late means the process did not run, and the gap is counted as a
pause. A deadline asks ``paused_since(its start)`` when it comes due and moves
itself on by the pauses it has not yet granted (``runtime/deadline.py``, the command
kind's pump in ``runtime/confined.py``; the worker's hard time limit does the same,
``worker/time_limits.py``).

What can and cannot be told this way:

* A pause of the whole process (all its threads) of ``LATE_S`` or more is seen and
  not counted. A busy machine delays a tick by milliseconds, far below ``LATE_S``.
* A tool that holds the GIL in C for over ``LATE_S`` starves the ticker too, and
  looks paused: it gets that time again. It cannot be interrupted meanwhile anyway
  (a Python signal handler runs only between bytecodes); the hard time limit, kept
  by the worker's main process, which does not run tools, still bounds it.
* A program in a process of its own (a command tool, an MCP server) is not paused
  with the worker unless its whole container or machine is: its own backstop (the
  shepherd's deadline, which is not moved) bounds it.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque

__all__ = ["LATE_S", "TICK_S", "PauseClock", "pause_clock"]

#: How often the ticker wakes.
TICK_S = 0.25
#: A wake-up this late (beyond ``TICK_S``) is a pause of the process.
LATE_S = 1.0
#: How many pauses are remembered (older ones are before any running deadline).
_KEPT = 64


class PauseClock:
    """The pauses of this process, seen by a ticker thread, on the monotonic clock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pauses: deque[tuple[float, float]] = deque(maxlen=_KEPT)
        self._last = time.monotonic()
        self._thread = threading.Thread(target=self._tick, name="pause-clock", daemon=True)
        self._thread.start()

    def _tick(self) -> None:
        while True:
            time.sleep(TICK_S)
            now = time.monotonic()
            with self._lock:
                if now - self._last - TICK_S >= LATE_S:
                    self._pauses.append((self._last + TICK_S, now))
                self._last = now

    def paused_since(self, since: float) -> float:
        """Seconds this process was paused since ``since`` (a ``time.monotonic()`` reading),
        a pause that is only now ending included."""
        now = time.monotonic()
        with self._lock:
            spans = list(self._pauses)
            if now - self._last - TICK_S >= LATE_S:  # resumed, and the ticker has not run yet
                spans.append((self._last + TICK_S, now))
        return sum(max(0.0, min(end, now) - max(start, since)) for start, end in spans)


_clock: PauseClock | None = None
_started = threading.Lock()


def _forget_in_child() -> None:
    # A forked child has no ticker thread (only the forking thread survives a fork), and
    # the lock may have been held by another thread of the parent.
    global _clock, _started
    _clock, _started = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)


def pause_clock() -> PauseClock:
    """This process's pause clock, started on first use (and again in a forked child)."""
    global _clock
    clock = _clock
    if clock is not None:
        return clock
    with _started:
        if _clock is None:
            _clock = PauseClock()
        return _clock
