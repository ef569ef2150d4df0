"""Keep a busy worker alive when Redis goes away (Celery/kombu 5.7).

When the connection to Redis is lost while a worker holds an unacknowledged
message (a tool is running), kombu closes the channel and then, restoring the
unacknowledged messages or acking the running task late, builds Redis
connection parameters from a connection whose ``client`` is already gone:
``AttributeError: 'NoneType' object has no attribute 'hostname'``, which Celery
treats as unrecoverable, so the worker exits. Raising a ``redis.ConnectionError``
there instead makes it the ordinary connection error kombu and Celery recover
from: the worker reconnects once Redis is back, and the message comes back after
the visibility timeout (tests/test_faults.py).
"""

from __future__ import annotations

from typing import Any

import redis
from kombu.transport import redis as kombu_redis

__all__ = ["install"]

_original = getattr(kombu_redis.Channel, "_connparams")  # noqa: B009 - untyped private API


def _connparams(self: Any, asynchronous: bool = False) -> Any:
    if getattr(self.connection, "client", None) is None:
        raise redis.ConnectionError("the broker connection is closed")
    return _original(self, asynchronous)


def install() -> None:
    """Patch kombu's Redis channel (idempotent)."""
    setattr(kombu_redis.Channel, "_connparams", _connparams)  # noqa: B010
