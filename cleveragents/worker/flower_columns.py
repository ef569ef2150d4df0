"""Flower's tasks page shows each invocation's skill and tool by default.

Flower reads its ``FLOWER_*`` settings from the environment once, right after
``celery -A worker flower`` has imported this app and before anything else of
ours runs in its process; Celery offers no hook that runs only in Flower's process.
So the app module sets this default when it is imported (``setdefault``: a
``FLOWER_TASKS_COLUMNS`` of your own wins). Only Flower reads the variable; it
patches no library. The arguments column shows the (redacted) arguments, which
name the skill and tool; result and exception show how each invocation ended.
"""

from __future__ import annotations

import os

__all__ = ["TASKS_COLUMNS", "set_default"]

#: The tasks page's columns: Flower's default plus arguments, result and exception, the
#: exception (a failure's error type and message) beside the state, where a person looks
#: first: the last columns are clipped on all but the widest screens.
TASKS_COLUMNS = "name,uuid,state,exception,args,result,received,runtime,worker"


def set_default() -> None:
    """Make ``TASKS_COLUMNS`` Flower's default in this process's environment."""
    os.environ.setdefault("FLOWER_TASKS_COLUMNS", TASKS_COLUMNS)
