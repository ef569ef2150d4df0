"""The Celery app of a local worker: the skill worker's own, plus a watch on its users.

The last command to leave stops the local worker. A command killed outright
(SIGKILL, a closed terminal) never leaves, so the worker watches for itself:
once no command holds the home's users lock it stops as the last command
would, and nothing is left behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import threading
import time
from typing import Any

from celery.signals import worker_ready

from cleveragents.embedded.inflight import held_by
from cleveragents.embedded.share import HomeShare
from cleveragents.settings import Settings
from worker import app

__all__ = ["app"]

#: How often a local worker checks that some command still uses it.
WATCH_S = 1.0


def _orphaned(share: HomeShare, queue_folder: str, pid: int) -> bool:
    with share.open_users() as users:
        try:
            fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a command still uses this worker
        # Nobody uses it: forget it (a command that comes now starts a fresh one), then
        # end at once if it holds nothing, or by a warm shutdown that gives back the rest.
        share.clear(pid)
        if not held_by(queue_folder, pid):
            os.killpg(pid, signal.SIGKILL)
        os.kill(pid, signal.SIGTERM)
        return True


def _watch(share: HomeShare, queue_folder: str, pid: int) -> None:
    while True:
        time.sleep(WATCH_S)
        with contextlib.suppress(OSError):
            if _orphaned(share, queue_folder, pid):
                return


@worker_ready.connect
def _start_watch(**_: Any) -> None:
    pid = os.getpid()
    # Only a local worker started by the runner, the leader of its own process group.
    if os.environ.get("CLEVERAGENTS_LOCAL_WORKER") != "1" or os.getpgid(0) != pid:
        return
    share = HomeShare(Settings.from_env().home)
    queue_folder = str(app.conf.broker_transport_options["data_folder_in"])
    args = (share, queue_folder, pid)
    threading.Thread(target=_watch, args=args, name="users-watch", daemon=True).start()
