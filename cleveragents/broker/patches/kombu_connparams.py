"""Keep a busy worker alive when Redis goes away (kombu 5.7).

When the connection to Redis is lost while a worker holds an unacknowledged
message (a tool is running), kombu closes the channel and then, restoring the
unacknowledged messages or acking the running task late, builds Redis
connection parameters from a connection whose ``client`` is already gone:
``AttributeError: 'NoneType' object has no attribute 'hostname'``, which Celery
treats as unrecoverable, so the worker exits. Raising a ``redis.ConnectionError``
there instead makes it the ordinary connection error kombu and Celery recover
from: the worker reconnects once Redis is back, and the message comes back after
the visibility timeout (tests/faults/test_faults.py).
"""

from __future__ import annotations

import functools
from typing import Any

import redis
from kombu.transport import redis as kombu_redis

from cleveragents.broker.patches.patch import Patch

__all__ = ["PATCH", "install", "installed"]

#: Marks the wrapper, so that installing twice wraps once.
_MARK = "_cleveragents_patch"


def install() -> None:
    """Wrap kombu's Redis ``Channel._connparams`` (idempotent)."""
    original = getattr(kombu_redis.Channel, "_connparams")  # noqa: B009 - untyped private API
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def _connparams(self: Any, asynchronous: bool = False) -> Any:
        if getattr(self.connection, "client", None) is None:
            raise redis.ConnectionError("the broker connection is closed")
        return original(self, asynchronous)

    setattr(_connparams, _MARK, True)
    setattr(kombu_redis.Channel, "_connparams", _connparams)  # noqa: B010


def installed() -> bool:
    """True once ``install`` has run in this process."""
    return bool(getattr(getattr(kombu_redis.Channel, "_connparams"), _MARK, False))  # noqa: B009


PATCH = Patch.for_part(__name__, "redis-connparams-patch", install)
