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

A record is only a claim: before a command signals the PID it names, or takes it
for its worker, ``HomeShare.is_local_worker`` checks in ``/proc`` that the
process is this user's, leads its own process group, and was started as the
local worker of this very home (its command line names the local worker's app
and, with Python's ``-X cleveragents.home=HOME``, the home). A record naming
anything else (planted, or left by an older version) is never signalled.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import itertools
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from cleveragents.embedded.private import private_folder, private_opener

__all__ = [
    "HOME_OPTION",
    "LOCAL_APP",
    "HomeShare",
    "WorkerRecord",
    "group_alive",
    "home_option",
    "join",
    "leave_last",
    "process_started",
]


#: The Celery app of a local worker: the skill worker's, plus the watch on its users.
LOCAL_APP = "cleveragents.embedded.app"
#: The Python ``-X`` option naming a local worker's home on its command line.
HOME_OPTION = "cleveragents.home"


def home_option(home: Path) -> tuple[str, str]:
    """The interpreter options that name ``home`` on a local worker's command line."""
    return ("-X", f"{HOME_OPTION}={home.resolve()}")


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


def _stat_fields(pid: int) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command name (state first); [] if none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return []
    # The command name in parentheses may hold spaces: fields count from its end.
    return stat.rsplit(")", 1)[-1].split()


def process_started(pid: int) -> str | None:
    """The kernel's start time of process ``pid``; None when there is none (or a zombie)."""
    if not _has_proc():  # no /proc: a live PID is taken as is
        return "?" if _signal_reaches(os.kill, pid) else None
    fields = _stat_fields(pid)
    if not fields or fields[0] in ("Z", "X"):
        return None
    return fields[19] if len(fields) > 19 else "?"


def _effective_uid(pid: int) -> int | None:
    # /proc/PID/status, not the owner of /proc/PID: a non-dumpable process's is root.
    try:
        status = Path(f"/proc/{pid}/status").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("Uid:"):
            ids = line.split()
            return int(ids[2]) if len(ids) > 2 and ids[2].isdigit() else None
    return None


def _holds_pair(argv: list[str], first: str, second: str) -> bool:
    return any(a == first and b == second for a, b in itertools.pairwise(argv))


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
        self.home = home.resolve()
        self.folder = self.home / "local-worker"
        self.users_path = self.folder / "users.lock"
        self.start_path = self.folder / "start.lock"
        self.record_path = self.folder / "worker.json"

    def open_users(self) -> IO[bytes]:
        """The users lock file, opened (not locked)."""
        private_folder(self.folder)
        return open(self.users_path, "a+b", opener=private_opener)

    @contextlib.contextmanager
    def starting(self) -> Iterator[None]:
        """Hold the start lock: one command at a time checks for, or starts, the worker."""
        private_folder(self.folder)
        with open(self.start_path, "a+b", opener=private_opener) as handle:
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
        with open(partial, "w", encoding="utf-8", opener=private_opener) as handle:
            handle.write(json.dumps({"pid": record.pid, "started": record.started}))
        os.replace(partial, self.record_path)

    def is_local_worker(self, record: WorkerRecord) -> bool:
        """True only when ``record`` names this home's local worker, alive.

        That is the very process recorded (same start time), run by this user,
        leading its own process group (which a stop kills), and started by a
        command as the local worker of this home: its command line names the
        local worker's app and this home. Without ``/proc`` nothing can be
        checked, and nothing is taken for the worker.
        """
        if not _has_proc():
            return False
        pid = record.pid
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            return False
        fields = _stat_fields(pid)
        ours = (
            len(fields) > 2
            and fields[2] == str(pid)  # the leader of its own group
            and _effective_uid(pid) == os.geteuid()
            and _holds_pair(argv, "-A", LOCAL_APP)
            and _holds_pair(argv, *home_option(self.home))
        )
        # Checked last: the same start time now means the PID was not reused meanwhile.
        return ours and process_started(pid) == record.started

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
