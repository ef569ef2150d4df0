"""Run a program under its shepherd: a deadline, bounded output, and nothing left behind.

The command kind's process side. The program runs under ``shepherd.py`` (a
child subreaper that kills every descendant of the program once it ends or is
told to stop, see there). This module feeds stdin, reads stdout and stderr
without ever blocking past the deadline (no ``communicate()`` that waits for an
end-of-file a stray descendant could hold), stops reading stdout at its limit,
keeps only a tail of stderr, and stops the whole tree at the deadline. It
returns what happened as ``Finished``; the command kind turns that into the
library's errors.

An outcome is decided by the program itself, the shepherd's direct child: once
it has exited, the shepherd kills what it left behind and reports, and the
output is whatever was written by then.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import selectors
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cleveragents.errors import ConfigurationError
from cleveragents.runtime.pauses import pause_clock

__all__ = [
    "SHEPHERD",
    "Finished",
    "ToolUser",
    "can_run_python",
    "run_confined",
    "tool_user_for",
]

#: The shepherd script, run with the worker's own interpreter (``-I -S``).
SHEPHERD = str(Path(__file__).resolve().with_name("shepherd.py"))
#: Bytes of stderr kept while a program runs (its last ones).
STDERR_KEEP = 64 * 1024
#: After the program ended: how long its pipes may take to reach end-of-file.
DRAIN_S = 0.5
#: After a stop: how long the shepherd may take to kill the tree and report.
STOP_WAIT_S = 1.0
#: The shepherd's own deadline comes this long after the program's (a backstop).
SHEPHERD_MARGIN_S = 1.0
#: The user command tools run as when a worker runs as root and nothing else is set.
DEFAULT_TOOL_USER = "nobody"
_CHUNK = 64 * 1024
#: Reports that mean the program ended by itself (or never started).
_ENDED = frozenset({"exit", "signal", "exec_error"})


@dataclass(frozen=True)
class ToolUser:
    """Who a command tool runs as: a user, with its primary group and no other groups."""

    name: str
    uid: int
    gid: int


def _lookup(name: str) -> ToolUser:
    try:
        entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except KeyError:
        if name.isdigit():  # a uid without a passwd entry: its group is its own number
            return ToolUser(name, int(name), int(name))
        if name == DEFAULT_TOOL_USER:
            return ToolUser(name, 65534, 65534)
        raise ConfigurationError(f"CLEVERAGENTS_TOOL_USER: no user {name!r}") from None
    return ToolUser(entry.pw_name, entry.pw_uid, entry.pw_gid)


def tool_user_for(setting: str | None, *, euid: int | None = None) -> ToolUser | None:
    """Who a worker's command tools run as (``CLEVERAGENTS_TOOL_USER``); None: its own user.

    Unset: ``nobody`` when the worker runs as root, else the worker's own user. A
    user name or uid: that user; the worker's own user means no switch.

    Raises:
        ConfigurationError: no such user, or another user while the worker is not root.
    """
    euid = os.geteuid() if euid is None else euid
    if setting is None:
        return _lookup(DEFAULT_TOOL_USER) if euid == 0 else None
    user = _lookup(setting)
    if user.uid == euid:
        return None
    if euid != 0:
        raise ConfigurationError(
            f"CLEVERAGENTS_TOOL_USER={setting}: only a worker running as root can run "
            "command tools as another user"
        )
    return user


def _permits(path: str, user: ToolUser, read: bool) -> bool:
    """Whether ``user`` may search (or read and search) ``path``, by its mode bits alone."""
    try:
        info = os.stat(path)
    except OSError:
        return False
    if user.uid == 0:
        return True
    if info.st_uid == user.uid:
        need = stat.S_IXUSR | (stat.S_IRUSR if read else 0)
    elif info.st_gid == user.gid:
        need = stat.S_IXGRP | (stat.S_IRGRP if read else 0)
    else:
        need = stat.S_IXOTH | (stat.S_IROTH if read else 0)
    return info.st_mode & need == need


def _reachable(path: str, user: ToolUser, read: bool) -> bool:
    real = Path(os.path.realpath(path))
    folders = [str(p) for p in reversed(real.parents)]
    return all(_permits(f, user, read=False) for f in folders) and _permits(str(real), user, read)


def can_run_python(user: ToolUser) -> bool:
    """Whether ``user`` can run this process's interpreter (its program and its library)."""
    library = os.path.dirname(os.__file__)
    return _reachable(sys.executable, user, read=False) and _reachable(library, user, read=True)


@dataclass(frozen=True)
class Finished:
    """How a confined program ended, and what it wrote."""

    stdout: bytes
    stderr_tail: bytes
    #: Its exit code (negative: killed by that signal); None when it did not end by itself.
    exit_code: int | None = None
    timed_out: bool = False
    #: Stdout passed the limit: reading stopped there and the program was stopped.
    too_large: bool = False
    #: Why the program could not be executed (not found, not permitted, ...).
    exec_error: str | None = None
    #: Descendants still alive when the program ended, killed by the shepherd.
    left: int = 0
    #: The shepherd ended without reporting (killed from outside): the program was killed.
    lost: bool = False


class _Session:
    """The pipes of one shepherd, pumped with ``select`` until a deadline."""

    def __init__(self, proc: subprocess.Popen[bytes], status: int, payload: bytes, limit: int):
        self.proc, self.limit = proc, limit
        self.selector = selectors.DefaultSelector()
        self.stdout, self.stderr, self.status = bytearray(), bytearray(), bytearray()
        self.payload, self.sent = payload, 0
        self.final: dict[str, Any] | None = None
        self.pid: int | None = None
        self.too_large = self.stopping = False
        assert proc.stdin is not None
        assert proc.stdout is not None
        assert proc.stderr is not None
        self.stdin_fd = proc.stdin.fileno()
        for fd in (self.stdin_fd, proc.stdout.fileno(), proc.stderr.fileno(), status):
            os.set_blocking(fd, False)
        self.selector.register(proc.stdout.fileno(), selectors.EVENT_READ, "stdout")
        self.selector.register(proc.stderr.fileno(), selectors.EVENT_READ, "stderr")
        self.selector.register(status, selectors.EVENT_READ, "status")
        if payload:
            self.selector.register(self.stdin_fd, selectors.EVENT_WRITE, "stdin")
        else:
            proc.stdin.close()

    def open(self, *names: str) -> bool:
        """Whether any of the named pipes is still being read or written."""
        return any(key.data in names for key in self.selector.get_map().values())

    def pump(self, until: float, *, drain: bool = False) -> None:
        """Move data until ``until``, or until the program ended (``drain``: and its pipes too).

        ``until`` moves on by any time this process was paused meanwhile (a frozen
        worker): the program's report may be waiting in its pipe (``runtime/pauses.py``).
        """
        clock, since, granted = pause_clock(), time.monotonic(), 0.0
        while not (self.too_large and not self.stopping):
            if self.final is not None and (not drain or not self.open("stdout", "stderr")):
                return
            left = until - time.monotonic()
            if left <= 0 and (paused := clock.paused_since(since) - granted) > 0:
                granted += paused
                until += paused
                continue
            if left <= 0 or not self.selector.get_map():
                return
            for key, _ in self.selector.select(left):
                getattr(self, f"_on_{key.data}")(key.fd)

    def _close(self, fd: int) -> None:
        self.selector.unregister(fd)
        if fd == self.stdin_fd:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()  # type: ignore[union-attr]

    def _on_stdin(self, fd: int) -> None:
        try:
            self.sent += os.write(fd, self.payload[self.sent : self.sent + _CHUNK])
        except BlockingIOError:
            return
        except OSError:  # the program closed its stdin: it does not want the rest
            self.sent = len(self.payload)
        if self.sent >= len(self.payload):
            self._close(fd)

    def _on_stdout(self, fd: int) -> None:
        chunk = _read(fd)
        if chunk is None:
            return
        if not chunk:
            self._close(fd)
            return
        self.stdout += chunk
        if len(self.stdout) > self.limit:
            self.too_large = True
            del self.stdout[self.limit :]
            self._close(fd)

    def _on_stderr(self, fd: int) -> None:
        chunk = _read(fd)
        if chunk is None:
            return
        if not chunk:
            self._close(fd)
            return
        self.stderr += chunk
        if len(self.stderr) > STDERR_KEEP:
            del self.stderr[:-STDERR_KEEP]

    def _on_status(self, fd: int) -> None:
        chunk = _read(fd)
        if chunk is None:
            return
        if not chunk:  # the shepherd has gone: whatever it said is all it will say
            self._close(fd)
            if self.final is None:
                self.final = {"lost": True}
            return
        self.status += chunk
        while b"\n" in self.status:
            line, _, rest = bytes(self.status).partition(b"\n")
            self.status = bytearray(rest)
            how, _, value = line.decode(errors="replace").partition(" ")
            if how == "pid":
                self.pid = int(value)
            elif how == "exec_error":
                self.final = {how: value}
            else:  # exit CODE LEFT, signal N LEFT, stopped - LEFT
                number, _, left = value.partition(" ")
                self.final = {how: None if number == "-" else int(number), "left": int(left)}

    def stop(self) -> None:
        """Have the shepherd kill the whole tree; kill the shepherd if it does not report."""
        self.stopping = True
        if self.final is None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            self.pump(time.monotonic() + STOP_WAIT_S)
        if self.final is None or "lost" in self.final:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            if self.pid is not None:  # the shepherd did not finish: take the tool's group
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.pid, signal.SIGKILL)

    def close(self) -> None:
        """Release every pipe and reap the shepherd."""
        for key in list(self.selector.get_map().values()):
            self.selector.unregister(key.fd)
        self.selector.close()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            with contextlib.suppress(OSError):
                stream.close()  # type: ignore[union-attr]
        try:
            self.proc.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _read(fd: int) -> bytes | None:
    """Up to one chunk; b"" at end-of-file; None when nothing is there yet."""
    try:
        return os.read(fd, _CHUNK)
    except BlockingIOError:
        return None
    except OSError:
        return b""


def _start(
    argv: list[str], env: dict[str, str], user: ToolUser | None, timeout_s: float
) -> tuple[subprocess.Popen[bytes], int]:
    status_read, status_write = os.pipe2(os.O_CLOEXEC)
    config = [
        str(status_write),
        str(os.getpid()),
        repr(timeout_s + SHEPHERD_MARGIN_S),
        str(user.uid) if user else "-",
        str(user.gid) if user else "-",
        "--",
    ]
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", SHEPHERD, *config, *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            pass_fds=(status_write,),
            start_new_session=True,  # no terminal's signals: the shepherd decides
            close_fds=True,
        )
    except BaseException:
        os.close(status_read)
        raise
    finally:
        os.close(status_write)
    return proc, status_read


def _outcome(session: _Session, final: dict[str, Any]) -> Finished:
    lost = "lost" in final
    timed_out = "stopped" in final and not session.too_large
    exit_code = None
    if not (timed_out or lost or session.too_large):
        if "exit" in final:
            exit_code = int(final["exit"])
        elif "signal" in final:
            exit_code = -int(final["signal"])
    return Finished(
        stdout=bytes(session.stdout),
        stderr_tail=bytes(session.stderr),
        exit_code=exit_code,
        timed_out=timed_out,
        too_large=session.too_large,
        exec_error=final.get("exec_error"),
        left=int(final.get("left", 0)),
        lost=lost,
    )


def run_confined(
    argv: list[str],
    env: dict[str, str],
    payload: bytes,
    timeout_s: float,
    *,
    max_stdout: int,
    user: ToolUser | None = None,
) -> Finished:
    """Run ``argv`` under a shepherd with ``payload`` on stdin, for at most ``timeout_s``.

    Returns once the program has exited and every descendant it left is dead, or
    once it was stopped (timed out, or stdout past ``max_stdout``), within about
    ``timeout_s`` plus ``STOP_WAIT_S``.

    Raises:
        OSError: the shepherd itself cannot be started.
    """
    deadline = time.monotonic() + timeout_s
    proc, status = _start(argv, env, user, timeout_s)
    session = _Session(proc, status, payload, max_stdout)
    try:
        session.pump(deadline)
        ended = session.final is not None and bool(_ENDED & session.final.keys())
        if ended and not session.too_large:
            session.pump(time.monotonic() + DRAIN_S, drain=True)
        if not ended or session.too_large:
            session.stop()
        # No report by the deadline (or by the end of the stop) is a time-out.
        return _outcome(session, session.final or {"stopped": True})
    except BaseException:
        session.stop()
        raise
    finally:
        session.close()
        os.close(status)
