"""Close the worker process to other processes of its own user: no ``/proc`` look inside.

A command tool that runs as the worker's user (a worker that is not root, as in
the compose file) could otherwise read ``/proc/<worker>/environ`` (the broker's
password, every secret of the worker) and its memory. ``prctl(PR_SET_DUMPABLE,
0)`` makes those files root's: only root can read them. Forked pool processes
inherit it; a program a tool executes does not (it is reset at ``execve``).
"""

from __future__ import annotations

import ctypes
import logging

__all__ = ["PR_GET_DUMPABLE", "PR_SET_DUMPABLE", "is_dumpable", "make_undumpable"]

PR_SET_DUMPABLE = 4
PR_GET_DUMPABLE = 3


def _prctl(option: int, value: int = 0) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    return int(libc.prctl(option, value, 0, 0, 0))


def make_undumpable() -> tuple[int, str]:
    """Make this process non-dumpable; a (level, message) note of what happened."""
    try:
        if _prctl(PR_SET_DUMPABLE, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")
    except (OSError, AttributeError) as exc:  # not Linux
        return logging.WARNING, f"the worker process stays dumpable: {exc}"
    return logging.INFO, "worker process is non-dumpable: tools cannot read its /proc files"


def is_dumpable() -> bool:
    """Whether this process is dumpable (its /proc files readable by its own user)."""
    return _prctl(PR_GET_DUMPABLE) == 1
