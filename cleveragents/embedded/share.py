"""One local worker per embedded home, shared by every command that needs it.

Files under ``$CLEVERAGENTS_HOME/local-worker``:

* ``users.lock``: every command using the local worker holds a shared flock on
  it for as long as it does. Whoever gets it exclusively has no other user: the
  last command out (or the worker itself, when its users died) stops the worker,
  and while it does, a new command waits to join, then starts a fresh one.
* ``start.lock``: held exclusively while a command checks for a live worker and
  starts one, so that commands starting together start one worker, not several.
* ``worker.json``: the running worker's PID and the kernel's start time of that
  PID, so that a reused PID is never taken for the worker.

The kernel drops a flock when its process dies, however it dies: a killed
command never keeps the worker alive, nor blocks the next one.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

__all__ = [
    "HomeShare",
    "WorkerRecord",
    "group_alive",
    "join",
    "leave_last",
    "process_started",
]


@functools.cache
def _has_proc() -> bool:
    return Path("/proc/self/stat").is_file()


def _signal_reaches(send: Callable[[int, int], None], pid: int) -> bool:
    try:
        send(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def process_started(pid: int) -> str | None:
    """The kernel's start time of process ``pid``; None when there is none (or a zombie)."""
    if not _has_proc():  # no /proc: a live PID is taken as is
        return "?" if _signal_reaches(os.kill, pid) else None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    # The command name in parentheses may hold spaces: fields count from its end.
    fields = stat.rsplit(")", 1)[-1].split()
    if not fields or fields[0] in ("Z", "X"):
        return None
    return fields[19] if len(fields) > 19 else "?"


def group_alive(pgid: int) -> bool:
    """True while any process of group ``pgid`` runs (zombies do not count)."""
    if not _has_proc():
        return _signal_reaches(os.killpg, pgid)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text(errors="replace").rsplit(")", 1)[-1].split()
        except OSError:
            continue
        if len(fields) > 2 and fields[0] not in ("Z", "X") and fields[2] == str(pgid):
            return True
    return False


@dataclass(frozen=True)
class WorkerRecord:
    """The local worker of a home: its PID (also its process group) and start time."""

    pid: int
    started: str

    def alive(self) -> bool:
        """True while this very process runs (a reused PID does not count)."""
        return process_started(self.pid) == self.started


class HomeShare:
    """The files by which the commands on one home share its local worker."""

    def __init__(self, home: Path) -> None:
        self.folder = home.resolve() / "local-worker"
        self.users_path = self.folder / "users.lock"
        self.start_path = self.folder / "start.lock"
        self.record_path = self.folder / "worker.json"

    def open_users(self) -> IO[bytes]:
        """The users lock file, opened (not locked)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        return open(self.users_path, "a+b")

    @contextlib.contextmanager
    def starting(self) -> Iterator[None]:
        """Hold the start lock: one command at a time checks for, or starts, the worker."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.start_path, "a+b") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield

    def read(self) -> WorkerRecord | None:
        """The recorded worker, if any (alive or not)."""
        try:
            raw = json.loads(self.record_path.read_text(encoding="utf-8"))
            return WorkerRecord(int(raw["pid"]), str(raw["started"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def write(self, record: WorkerRecord) -> None:
        """Record the running worker (atomically: a reader sees the old record or this one)."""
        partial = self.record_path.with_name(f".{self.record_path.name}.{os.getpid()}")
        partial.write_text(json.dumps({"pid": record.pid, "started": record.started}), "utf-8")
        os.replace(partial, self.record_path)

    def clear(self, pid: int | None = None) -> None:
        """Forget the recorded worker (only if it is ``pid``, when given)."""
        record = self.read()
        if pid is None or (record is not None and record.pid == pid):
            with contextlib.suppress(FileNotFoundError):
                self.record_path.unlink()


def join(users: IO[bytes]) -> None:
    """Count this process as a user (waits while a last user stops the worker)."""
    fcntl.flock(users, fcntl.LOCK_SH)


def leave_last(users: IO[bytes]) -> bool:
    """Stop counting as a user; True (holding the lock exclusively) when no other user is left."""
    fcntl.flock(users, fcntl.LOCK_UN)
    try:
        fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True
