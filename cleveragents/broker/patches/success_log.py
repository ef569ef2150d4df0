"""Keep a task's return value out of the worker log (Celery 5.7).

Celery logs ``Task name[id] succeeded in 0.01s: <return value>`` at INFO, and a
skill invocation's return value holds the tool's output, which stays out of logs
(docs/guarantees.md). There is no setting for that line: its format is the private
module global ``celery.app.trace.LOG_SUCCESS``, read each time a task succeeds.
Without this patch the guarantee breaks, so a worker on another Celery series
refuses to start rather than skip it.
"""

from __future__ import annotations

from celery.app import trace

from cleveragents.broker.patches.patch import Patch

__all__ = ["LOG_SUCCESS", "PATCH", "install", "installed"]

#: Celery's success line without the return value: the id, name and runtime remain.
LOG_SUCCESS = "Task %(name)s[%(id)s] succeeded in %(runtime)ss"


def install() -> None:
    """Replace Celery's success-log format (idempotent)."""
    trace.LOG_SUCCESS = LOG_SUCCESS


def installed() -> bool:
    """True once ``install`` has run in this process."""
    return bool(trace.LOG_SUCCESS == LOG_SUCCESS)


PATCH = Patch.for_part(__name__, "success-log-patch", install)
