"""The Celery app of a local worker: the skill worker's own, plus a watch on its users.

The last command to leave stops the local worker. A command killed outright
(SIGKILL, a closed terminal) never leaves, so the worker watches for itself:
once no command holds the home's users lock it stops as the last command
would, and nothing is left behind.

Importing this module does nothing: ``celery -A cleveragents.embedded.app``
asks it for ``app``, and only then is the worker's app loaded and the watch
connected.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from celery import Celery
from celery.signals import worker_ready
from redis import RedisError

from cleveragents.broker.redis.liveness import forget_holders, holds_messages
from cleveragents.embedded.runner import LOCAL_WORKER_ENV, home_client
from cleveragents.embedded.share import HomeShare
from cleveragents.settings import Settings

#: A program's module, not an API: Celery asks it for ``app`` (see ``__getattr__``).
__all__: list[str] = []

#: How often a local worker checks that some command still uses it.
WATCH_S = 1.0


def _orphaned(share: HomeShare, home: Path, pid: int) -> bool:
    with share.open_users() as users:
        try:
            fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a command still uses this worker
        # Nobody uses it: forget it (a command that comes now starts a fresh one), then
        # end at once if it holds nothing, or by a warm shutdown that gives back the rest.
        share.clear(pid)
        client = home_client(home)
        try:
            idle = not holds_messages(client, pid)
            if idle:  # its heartbeat goes with it: no wait takes it for a worker
                forget_holders(client, pid)
        finally:
            client.close()
        if idle:
            os.killpg(pid, signal.SIGKILL)
        os.kill(pid, signal.SIGTERM)
        return True


def _watch(share: HomeShare, home: Path, pid: int) -> None:
    while True:
        time.sleep(WATCH_S)
        with contextlib.suppress(OSError, RedisError):
            if _orphaned(share, home, pid):
                return


def _start_watch(**_: Any) -> None:
    pid = os.getpid()
    # Only a local worker started by the runner, the leader of its own process group.
    if os.environ.get(LOCAL_WORKER_ENV) != "1" or os.getpgid(0) != pid:
        return
    home = Settings.from_env().home
    args = (HomeShare(home), home, pid)
    threading.Thread(target=_watch, args=args, name="users-watch", daemon=True).start()


def __getattr__(name: str) -> Celery:
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from cleveragents.worker import app

    worker_ready.connect(_start_watch, dispatch_uid="cleveragents-local-worker-watch")
    return app
