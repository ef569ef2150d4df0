"""Stop a python tool that outlives its timeout, without losing the process.

In the main thread (where a Celery prefork child runs its tasks) a real-time
interval timer (``setitimer``) delivers SIGALRM at the deadline; the handler
raises ``ToolTimeout``, which interrupts even a blocking ``time.sleep`` or a
socket read. Elsewhere a shared watchdog thread injects ``ToolTimeout`` into the
tool's thread with ``PyThreadState_SetAsyncExc``, which takes effect at the
tool's next Python bytecode. Either way the exception is re-delivered every
``REPEAT_S`` until the tool has unwound, so a tool that catches it once is hit
again. ``ToolTimeout`` derives from ``BaseException`` so that a tool's
``except Exception`` does not swallow it. Cost per invocation: two ``setitimer``
calls (main thread), or a heap push under a lock (other threads).
"""

from __future__ import annotations

import ctypes
import heapq
import itertools
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["REPEAT_S", "ToolTimeout", "deadline"]

#: After the first interruption, how often the tool is interrupted again until it stops.
REPEAT_S = 0.05


class ToolTimeout(BaseException):
    """Raised inside a tool whose time is up."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise ToolTimeout


@contextmanager
def _alarm(timeout_s: float) -> Iterator[None]:
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    armed_at = time.monotonic()
    # An outer timer (a deadline further out, pytest-timeout) is put back afterwards.
    outer, outer_interval = signal.setitimer(signal.ITIMER_REAL, timeout_s, REPEAT_S)
    try:
        yield
    finally:
        while True:
            try:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)
                break
            except ToolTimeout:
                # The alarm went off while it was being disarmed: disarm again, or it
                # would keep firing into code that is not the tool's.
                continue
        if outer > 0:
            left = outer - (time.monotonic() - armed_at)
            signal.setitimer(signal.ITIMER_REAL, max(left, 0.001), outer_interval)


class _Watchdog:
    """One daemon thread that interrupts other threads whose deadline has passed."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int]] = []
        self._active: dict[int, int] = {}
        self._cond = threading.Condition()
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, timeout_s: float, thread_id: int) -> int:
        token = next(self._ids)
        with self._cond:
            self._active[token] = thread_id
            heapq.heappush(self._heap, (time.monotonic() + timeout_s, token, thread_id))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="tool-deadlines", daemon=True
                )
                self._thread.start()
            self._cond.notify()
        return token

    def disarm(self, token: int) -> None:
        while True:
            try:
                with self._cond:
                    thread_id = self._active.pop(token, None)
                if thread_id is not None:
                    # Withdraw an interruption that was set but not yet delivered: it
                    # must not surface later, in code that is not the tool's.
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), None)
                return
            except ToolTimeout:
                # Delivered here, before the token was withdrawn: withdraw it now, or
                # the watchdog would keep interrupting this thread.
                continue

    def _run(self) -> None:
        with self._cond:
            while True:
                while self._heap and self._heap[0][1] not in self._active:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                due, token, thread_id = self._heap[0]
                wait = due - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                heapq.heapreplace(self._heap, (time.monotonic() + REPEAT_S, token, thread_id))
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(thread_id), ctypes.py_object(ToolTimeout)
                )


_watchdog = _Watchdog()


@contextmanager
def _watched(timeout_s: float) -> Iterator[None]:
    token = _watchdog.arm(timeout_s, threading.get_ident())
    try:
        yield
    finally:
        _watchdog.disarm(token)


def deadline(timeout_s: float) -> Any:
    """A context manager that raises ``ToolTimeout`` in its body once ``timeout_s`` has passed."""
    if threading.current_thread() is threading.main_thread():
        return _alarm(timeout_s)
    return _watched(timeout_s)


def call_with_deadline(fn: Callable[[], Any], timeout_s: float) -> Any:
    """Call ``fn``; raise ``ToolTimeout`` if it runs longer than ``timeout_s``."""
    with deadline(timeout_s):
        return fn()
