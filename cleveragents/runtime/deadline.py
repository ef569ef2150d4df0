"""Stop a python tool that outlives its timeout, without losing the process.

In the main thread (where a Celery prefork child runs its tasks) a real-time
interval timer (``setitimer``) delivers SIGALRM at the deadline; the handler
raises ``ToolTimeout``, which interrupts even a blocking ``time.sleep`` or a
socket read. Elsewhere a shared watchdog thread injects ``ToolTimeout`` into the
tool's thread with ``PyThreadState_SetAsyncExc``, which takes effect at the
tool's next Python bytecode. Either way the exception is re-delivered every
``REPEAT_S`` until the tool has unwound, so a tool that catches it once is hit
again. ``ToolTimeout`` derives from ``BaseException`` so that a tool's
``except Exception`` does not swallow it.

The time is the tool's running time: a deadline that comes due after its process
was paused (``SIGSTOP``, a frozen container) moves on by the pause instead
(``runtime/pauses.py``), so that a worker does not blame the tool for its own pause.

An interruption is only ever raised in the body of the deadline: never while it
is being set up or taken down (where it would leave the timer or the watchdog
armed, and interrupt code that is not the tool's), and never once the frame that
entered it has gone. Cost per invocation: two ``setitimer`` and two ``signal``
calls, about 2 us (main thread), or a heap push under a lock (other threads).
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # C module: skips ~3 us of enum wrapping
import ctypes
import heapq
import itertools
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any, Literal

from cleveragents.runtime.pauses import pause_clock

__all__ = ["REPEAT_S", "ToolTimeout", "call_with_deadline", "deadline"]

#: After the first interruption, how often the tool is interrupted again until it stops.
REPEAT_S = 0.05

_Where = Literal["body", "machinery", "gone"]


class ToolTimeout(BaseException):
    """Raised inside a tool whose time is up."""


def _where(frame: FrameType | None, guarded: FrameType) -> _Where:
    """Whether ``frame`` runs the body of a deadline entered in ``guarded``, or its machinery."""
    while frame is not None:
        if frame is guarded:
            return "body"
        if frame.f_code in _MACHINERY:
            return "machinery"
        frame = frame.f_back
    return "gone"


#: Frames that entered a deadline in the main thread, innermost last.
_main_guards: list[FrameType] = []
#: Those deadlines, in the same order.
_main_deadlines: list[_Deadline] = []


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    if _main_guards and _where(frame, _main_guards[-1]) == "body":
        if _main_deadlines[-1].grant_pause():
            return  # the process was paused: the timer was set again for that long
        raise ToolTimeout
    # Being set up or taken down: the timer repeats, and __exit__ disarms it.


class _Watchdog:
    """One daemon thread that interrupts other threads whose deadline has passed."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int]] = []
        self._active: dict[int, tuple[int, FrameType]] = {}
        #: token -> when it was armed, and the pause time granted since
        self._armed: dict[int, tuple[float, float]] = {}
        # A plain lock, taken with ``with`` by the tool threads: acquiring and releasing it
        # runs no Python code, so an interruption delivered to a tool thread can never
        # leave it held. (A Condition's own __enter__ and __exit__ are Python methods:
        # one landing there deadlocked every later timed invocation.)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, timeout_s: float, thread_id: int, guarded: FrameType) -> int:
        token = next(self._ids)
        pause_clock()  # started before the tool: a pause from now on is seen
        with self._lock:
            self._active[token] = (thread_id, guarded)
            now = time.monotonic()
            self._armed[token] = (now, 0.0)
            heapq.heappush(self._heap, (now + timeout_s, token))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="tool-deadlines", daemon=True
                )
                self._thread.start()
            self._cond.notify()
        return token

    def disarm(self, token: int) -> None:
        with self._lock:
            entry = self._active.pop(token, None)
            self._armed.pop(token, None)
        if entry is not None:
            # Withdraw an interruption that was set but not yet delivered: it must
            # not surface later, in code that is not the tool's.
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(entry[0]), None)

    def _run(self) -> None:
        with self._cond:
            while True:
                while self._heap and self._heap[0][1] not in self._active:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                due, token = self._heap[0]
                wait = due - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                armed_at, granted = self._armed[token]
                paused = pause_clock().paused_since(armed_at) - granted
                if paused > 0:  # the process was paused: that time is not the tool's
                    self._armed[token] = (armed_at, granted + paused)
                    heapq.heapreplace(self._heap, (due + paused, token))
                    continue
                thread_id, guarded = self._active[token]
                where = _where(sys._current_frames().get(thread_id), guarded)
                if where == "gone":  # left without disarming (interrupted on its way out)
                    del self._active[token]
                    self._armed.pop(token, None)
                    continue
                heapq.heapreplace(self._heap, (time.monotonic() + REPEAT_S, token))
                if where == "body":
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(
                        ctypes.c_ulong(thread_id), ctypes.py_object(ToolTimeout)
                    )


_watchdog = _Watchdog()


class _Deadline:
    """The context manager ``deadline`` returns; its body is the frame that enters it."""

    __slots__ = (
        "_armed_at",
        "_granted",
        "_main",
        "_outer",
        "_previous",
        "_timeout_s",
        "_token",
    )

    def __init__(self, timeout_s: float) -> None:
        self._timeout_s = timeout_s
        self._main = False
        self._token: int | None = None
        self._previous: Any = None
        self._outer = (0.0, 0.0)
        self._armed_at = 0.0
        self._granted = 0.0

    def grant_pause(self) -> bool:
        """At the alarm: set the timer again for the time this process was paused since
        it was armed and not yet granted; False when there is none (the time is up)."""
        paused = pause_clock().paused_since(self._armed_at) - self._granted
        if paused <= 0:
            return False
        self._granted += paused
        signal.setitimer(signal.ITIMER_REAL, paused, REPEAT_S)
        return True

    def __enter__(self) -> None:
        guarded = sys._getframe(1)
        if threading.current_thread() is not threading.main_thread():
            self._token = _watchdog.arm(self._timeout_s, threading.get_ident(), guarded)
            return
        self._main = True
        pause_clock()  # started before the tool: a pause from now on is seen
        _main_guards.append(guarded)
        _main_deadlines.append(self)
        self._previous = _signal.signal(signal.SIGALRM, _on_alarm)
        self._armed_at = time.monotonic()
        # An outer timer (a deadline further out, pytest-timeout) is put back afterwards.
        self._outer = signal.setitimer(signal.ITIMER_REAL, self._timeout_s, REPEAT_S)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if not self._main:
            if self._token is not None:
                _watchdog.disarm(self._token)
            return
        signal.setitimer(signal.ITIMER_REAL, 0)
        _signal.signal(signal.SIGALRM, self._previous)
        _main_guards.pop()
        _main_deadlines.pop()
        outer, interval = self._outer
        if outer > 0:
            left = outer - (time.monotonic() - self._armed_at)
            signal.setitimer(signal.ITIMER_REAL, max(left, 0.001), interval)


_MACHINERY = frozenset(
    {
        _Deadline.__enter__.__code__,
        _Deadline.__exit__.__code__,
        _Watchdog.arm.__code__,
        _Watchdog.disarm.__code__,
        _Deadline.grant_pause.__code__,
    }
)


def deadline(timeout_s: float) -> _Deadline:
    """A context manager that raises ``ToolTimeout`` in its body once ``timeout_s`` has passed.

    The body is the code of the frame that enters it (and what that code calls);
    enter it in a function that returns right after the ``with`` block, as
    ``call_with_deadline`` does.
    """
    return _Deadline(timeout_s)


def call_with_deadline(
    fn: Callable[..., Any], timeout_s: float, /, *args: Any, **kwargs: Any
) -> Any:
    """Call ``fn(*args, **kwargs)``; raise ``ToolTimeout`` if it runs longer than ``timeout_s``."""
    with deadline(timeout_s):
        return fn(*args, **kwargs)
