"""Celery's Redis result backend, storing a task's state in one round trip, not two.

Celery stores a state by reading the stored one first (a ``GET``: a ``SUCCESS`` is
never overwritten, so that a lost worker's late update cannot replace a result),
then writing it and publishing it (``SET`` and ``PUBLISH`` in a pipeline). A worker
stores two states per invocation (``STARTED``, then the result): four round trips.
Here one Lua script does the same check and write, atomically (no other store can
come between the read and the write), so two; and only a finished state is
published: a waiting ``AsyncResult.get()`` wakes only for those (it reads the stored
state after it subscribes, so it never needs the others), and producers no longer
decode a ``STARTED`` message per invocation. ``AsyncResult.state`` still reads
``STARTED`` from the stored key, as before.

A worker on a ``redis://`` or ``rediss://`` result backend uses it (named by class
path before the URL, ``cleveragents/worker/startup.py``); producers, Flower and every reader keep
Celery's own, which reads the same keys.
"""

from __future__ import annotations

import math
from typing import Any

from celery import states
from celery.backends.redis import RedisBackend as CeleryRedisBackend
from celery.exceptions import BackendStoreError
from kombu.utils.encoding import bytes_to_str
from kombu.utils.objects import cached_property

from cleveragents.stores.redis_retry import say_away, say_back
from cleveragents.stores.redis_sockets import keepalive_options
from cleveragents.stores.state_lua import STORE_STATE_LUA

__all__ = [
    "BACKEND_CLASS",
    "SEND_ONLY_BACKEND_CLASS",
    "STORE_LUA",
    "RedisBackend",
    "SendOnlyRedisBackend",
    "send_only_result_backend",
    "worker_result_backend",
]

#: This backend's class path, as Celery's ``result_backend`` names it before a URL.
BACKEND_CLASS = "cleveragents.broker.redis.result_backend:RedisBackend"

#: The producer backend of a client that awaits results by other means (``AsyncSkillClient``).
SEND_ONLY_BACKEND_CLASS = "cleveragents.broker.redis.result_backend:SendOnlyRedisBackend"

#: KEYS[1]: the task's key. ARGV: the encoded state, its time to live in seconds (0:
#: none), 1 to publish it. Returns 0 when a stored SUCCESS was kept, else 1.
STORE_LUA = STORE_STATE_LUA + """
if not store_state(KEYS[1], ARGV[1], ARGV[2], false) then
  return 0
end
if ARGV[3] == '1' then
  redis.call('PUBLISH', KEYS[1], ARGV[1])
end
return 1
"""


class RedisBackend(CeleryRedisBackend):  # type: ignore[misc]
    """Celery's Redis result backend with a state stored in one script (module docstring)."""

    #: Whether the store under way met Redis away (``ensure``).
    _away = False
    # Celery's, absent from its stubs.
    _get_result_meta: Any
    expires: Any
    failure_expires: Any
    connparams: dict[str, Any]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # A lost Redis host's half-open connections dropped within seconds, for the
        # results and for the stores, which share this pool (stores/redis_sockets.py).
        self.connparams.update(socket_keepalive=True, socket_keepalive_options=keepalive_options())

    def ensure(self, fun: Any, args: Any, **policy: Any) -> Any:
        """Celery's retries of a store while Redis is away, said as the stores say theirs:
        one warning an outage, one line when it answers again (not an ERROR a retry)."""
        self._away = False
        value = super().ensure(fun, args, **policy)
        if self._away:
            say_back()
        return value

    def on_connection_error(  # type: ignore[override]
        self, max_retries: Any, exc: Exception, intervals: Any, retries: int
    ) -> float:
        self._away = True
        say_away(exc)
        return float(next(intervals))

    @cached_property
    def _store_script(self) -> Any:
        return self.client.register_script(STORE_LUA)

    def _store_result(
        self,
        task_id: str,
        result: Any,
        state: str,
        traceback: Any = None,
        request: Any = None,
        **kwargs: Any,
    ) -> Any:
        key, value, ttl = self.encoded_state(task_id, result, state, traceback, request)
        publish = state in states.READY_STATES
        self.ensure(self._store, (key, value, ttl, publish))
        return result

    def encoded_state(
        self, task_id: str, result: Any, state: str, traceback: Any = None, request: Any = None
    ) -> tuple[str, str | bytes, int]:
        """A state as it is stored: its key, its encoded meta, its time to live (s, 0: none).

        Raises:
            BackendStoreError: the encoded meta is too large for Redis.
        """
        meta = self._get_result_meta(
            result=result, state=state, traceback=traceback, request=request
        )
        meta["task_id"] = bytes_to_str(task_id)
        value = self.encode(meta)
        if isinstance(value, str) and len(value) > self._MAX_STR_VALUE_SIZE:
            too_large = "value too large for Redis backend"
            raise BackendStoreError(too_large, state=state, task_id=task_id)
        expires = self.failure_expires if state == states.FAILURE else self.expires
        seconds = expires.total_seconds() if hasattr(expires, "total_seconds") else expires
        ttl = math.ceil(float(seconds)) if seconds and seconds > 0 else 0
        return bytes_to_str(self.get_key_for_task(task_id)), value, ttl

    def _store(self, key: str, value: Any, ttl: int, publish: bool) -> Any:
        return self._store_script(keys=[key], args=[value, ttl, 1 if publish else 0])


def worker_result_backend(url: str | None) -> str | None:
    """The ``result_backend`` a worker sets for ``url`` (None: keep it as it is)."""
    if not url or url.partition("://")[0].lower() not in ("redis", "rediss"):
        return None
    return f"{BACKEND_CLASS}+{url}"


class SendOnlyRedisBackend(CeleryRedisBackend):  # type: ignore[misc]
    """Celery's Redis result backend, minus the subscription Celery makes as a task is sent.

    ``send_task`` calls the backend's ``on_task_call`` hook, which on Redis subscribes
    the backend's own (synchronous) pub/sub connection to the task's channel, for an
    ``AsyncResult.get()`` to come. ``AsyncSkillClient`` awaits results on its event loop
    with its own subscription (``cleveragents/aio/results.py``): here the hook does
    nothing, so no second subscription is made per send, and none is left behind
    unread. Reading a result (``get_task_meta``) is Celery's, unchanged.
    """

    def on_task_call(self, producer: Any, task_id: str) -> None:
        return None


def send_only_result_backend(url: str) -> str:
    """The ``result_backend`` of a producer that never waits through Celery, for ``url``."""
    return f"{SEND_ONLY_BACKEND_CLASS}+{url}"
