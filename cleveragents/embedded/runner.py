"""The local worker of an embedded home: started by the first command that needs it,
stopped by the last one (``cleveragents.embedded.share`` says how they agree).

Commands that run at once on one home share one worker process; none of them
stops it under another. What the worker holds when it is stopped is not lost:
it holds nothing (it is killed at once, in milliseconds), or it gets a warm
shutdown, and whatever it still held goes back to the queue either way.

A command signals the PID of ``worker.json`` only once ``HomeShare.is_local_worker``
has shown it to be this home's local worker; a record naming any other process
is reported, left alone, and replaced by a worker the command starts itself.
The worker runs under umask 077: whatever it writes in the home is its user's alone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

import redis

from cleveragents.broker.redis.liveness import forget_holders, holds_messages
from cleveragents.embedded.private import FOLDER_MODE, private_folder, private_home, private_opener
from cleveragents.embedded.server import join_server, leave_server
from cleveragents.embedded.share import (
    LOCAL_APP,
    HomeShare,
    WorkerRecord,
    group_alive,
    home_option,
    join,
    leave_last,
    process_started,
)
from cleveragents.embedded.urls import HomeUrls
from cleveragents.errors import ConfigurationError
from cleveragents.settings import Settings

__all__ = [
    "LOCAL_WORKER_ENV",
    "LocalWorker",
    "local_worker_running",
    "stop_worker",
    "worker_command",
]

#: How long a local worker may take to become ready.
START_TIMEOUT_S = 60.0
#: How long a warm shutdown may take before the worker is killed.
STOP_TIMEOUT_S = 15.0
#: How long the processes of a killed worker may take to disappear.
KILL_WAIT_S = 5.0
#: How long a stop waits for the acks of results just stored (``acks_late``: the
#: result is stored, then the message acknowledged, milliseconds apart).
ACK_GRACE_S = 1.0
#: Set (to "1") in a local worker's environment.
LOCAL_WORKER_ENV = "CLEVERAGENTS_LOCAL_WORKER"
#: The umask of a local worker: what it creates in the home is its user's alone.
LOCAL_WORKER_UMASK = 0o777 & ~FOLDER_MODE

log = logging.getLogger("cleveragents.embedded")


def worker_command(
    *extra: str, app: str = "cleveragents.worker", python: Sequence[str] = ()
) -> list[str]:
    """``celery -A worker worker`` run by this interpreter (with ``python`` options)."""
    return [sys.executable, *python, "-m", "celery", "-A", app, "worker", *extra]


def local_worker_running(settings: Settings) -> bool:
    """True while a command's local worker runs for this home (a ``cleveragents worker``
    someone started by hand is not one: it is not recorded)."""
    share = HomeShare(settings.home)
    record = share.read()
    return record is not None and record.alive() and share.is_local_worker(record)


def home_client(home: Path) -> redis.Redis:
    """A client of the home's server (which the caller has joined)."""
    return redis.Redis.from_url(HomeUrls.of(home).client, socket_timeout=30)


def _wait_until(done: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _not_ours(share: HomeShare, record: WorkerRecord, then: str) -> None:
    log.warning(
        "%s names PID %d, which is not this home's local worker: %s",
        share.record_path,
        record.pid,
        then,
    )


def stop_worker(share: HomeShare, client: redis.Redis) -> None:
    """Stop the recorded worker of a home (the caller holds the users lock exclusively).

    Only this home's local worker is signalled (``HomeShare.is_local_worker``):
    a record naming any other process is forgotten, and the process left alone.
    """
    record = share.read()
    if record is not None and share.is_local_worker(record):
        if not _wait_until(lambda: not holds_messages(client, record.pid), ACK_GRACE_S):
            # It runs or has reserved messages nobody waits for (a submit without
            # --wait): a warm shutdown lets running tools finish, reserved ones go back.
            with contextlib.suppress(ProcessLookupError):
                os.kill(record.pid, signal.SIGTERM)
            _wait_until(lambda: not record.alive(), STOP_TIMEOUT_S)
        # Its group, while it or a process of its group lives: once all are gone,
        # the group's id is free for the kernel to give to a stranger.
        if record.alive() or group_alive(record.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(record.pid, signal.SIGKILL)
        _wait_until(lambda: not group_alive(record.pid), KILL_WAIT_S)
        # Gone: its heartbeat means nothing now (a wait for a worker must not count it,
        # and what it still held is given back at the next reap).
        if not group_alive(record.pid):
            forget_holders(client, record.pid)
    elif record is not None and record.alive():
        _not_ours(share, record, "left alone")
    share.clear()
    # A message it fetched after the check, or held past the warm shutdown, goes back to
    # its queue once its holder's heartbeat has expired (the next worker's reaper).


class LocalWorker:
    """One command's share of its home's local Celery worker (a context manager)."""

    def __init__(self, settings: Settings, *, concurrency: int = 2) -> None:
        self.settings = settings
        #: Worker processes, when this command is the one that starts the worker.
        self.concurrency = concurrency
        self.share = HomeShare(settings.home)
        self.log_path = settings.home.resolve() / "logs" / "local-worker.log"
        #: The shared worker's PID once joined.
        self.pid: int | None = None
        self._users: IO[bytes] | None = None
        #: True once this command, the last one out, stopped the worker.
        self.stopped_worker = False
        #: True when this command started the worker (others joined one running).
        self.spawned = False
        self._joined = False

    def start(self) -> LocalWorker:
        """Join the home's local worker, starting it if none runs; return once it consumes."""
        if self._users is not None:
            return self
        private_home(self.settings.home)  # this user's alone, or refused before any write
        join_server(self.settings.home)  # kept while this command uses the worker
        self._joined = True
        users = self.share.open_users()
        self._users = users
        try:
            join(users)
            with self.share.starting():
                record = self._recorded()
                if record is None:
                    record = self._spawn()
                    self.share.write(record)
                    self.spawned = True
            self.pid = record.pid
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Leave the worker; the last command to leave stops it."""
        users, self._users = self._users, None
        self.pid = None
        if users is not None:
            with users:  # closing the file drops whatever lock is left
                if leave_last(users):
                    client = home_client(self.settings.home)
                    try:
                        stop_worker(self.share, client)
                    finally:
                        client.close()
                    self.stopped_worker = True
        if self._joined:
            self._joined = False
            leave_server(self.settings.home)

    def _recorded(self) -> WorkerRecord | None:
        """The home's running local worker, if the record names one."""
        record = self.share.read()
        if record is None or not record.alive():
            return None  # none yet, or it died: no word needed
        if self.share.is_local_worker(record):
            return record
        _not_ours(self.share, record, "left alone; starting a local worker for this command")
        return None

    def _spawn(self) -> WorkerRecord:
        private_folder(self.log_path.parent)
        ready = self.share.folder / f"ready-{uuid.uuid4().hex}"
        env = dict(os.environ)
        env["CLEVERAGENTS_HOME"] = str(self.settings.home.resolve())
        env["CLEVERAGENTS_READY_FILE"] = str(ready)
        env[LOCAL_WORKER_ENV] = "1"
        env["NOSETPS"] = "1"  # Celery keeps its command line: is_local_worker reads it
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
        command = worker_command(
            *("--loglevel", "WARNING", "--concurrency", str(self.concurrency)),
            *("--hostname", f"embedded-{os.getpid()}@%h"),
            *("--without-mingle", "--without-gossip", "--without-heartbeat"),
            app=LOCAL_APP,
            python=home_option(self.settings.home),  # names its home: is_local_worker
        )
        with open(self.log_path, "ab", opener=private_opener) as output:
            proc = subprocess.Popen(
                command,
                env=env,
                stdout=output,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: stopped as a whole
                umask=LOCAL_WORKER_UMASK,
            )
        # Reap it whenever it ends, even if another command is the one that stops it.
        threading.Thread(target=proc.wait, name="local-worker-reaper", daemon=True).start()
        try:
            started = process_started(proc.pid)
            up = _wait_until(lambda: ready.exists() or proc.poll() is not None, START_TIMEOUT_S)
            if started is None or not up or proc.poll() is not None:
                raise ConfigurationError(f"the local worker did not start (log {self.log_path})")
        except BaseException as exc:
            if proc.poll() is None or group_alive(proc.pid):  # only the group it started
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
            _wait_until(lambda: not group_alive(proc.pid), KILL_WAIT_S)
            if isinstance(exc, ConfigurationError):
                raise ConfigurationError(f"{exc}: {self._log_tail()}") from None
            raise
        finally:
            ready.unlink(missing_ok=True)
        return WorkerRecord(proc.pid, started)

    def _log_tail(self) -> str:
        lines = self.log_path.read_text(errors="replace").strip().splitlines()
        return " | ".join(lines[-3:])

    def __enter__(self) -> LocalWorker:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
