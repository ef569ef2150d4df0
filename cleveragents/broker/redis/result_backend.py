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
path before the URL, ``cleveragents/worker/startup.py``), and on a ``sentinel://`` one
``SentinelBackend``, the same over Celery's Sentinel backend (its connections find the
primary through the Sentinels each time they connect); producers, Flower and every
reader keep Celery's own, which reads the same keys (on ``sentinel://``, as
``FollowingSentinelBackend``: Celery's, with connections that follow a failover at once,
``sentinel_follow.py``). A worker's connections also carry the fleet's TCP keepalive
(``stores/redis_sockets.py``).
"""

from __future__ import annotations

import math
from typing import Any

from celery import states
from celery.backends.redis import RedisBackend as CeleryRedisBackend
from celery.backends.redis import SentinelBackend as CelerySentinelBackend
from celery.exceptions import BackendStoreError
from kombu.utils.encoding import bytes_to_str
from kombu.utils.objects import cached_property

from cleveragents.broker.redis.sentinel_follow import follow
from cleveragents.stores.redis_retry import say_away, say_back
from cleveragents.stores.redis_sockets import keepalive_options
from cleveragents.stores.replication import ReplicaWait
from cleveragents.stores.state_lua import STORE_STATE_LUA

__all__ = [
    "BACKEND_CLASS",
    "FOLLOWING_SENTINEL_BACKEND_CLASS",
    "SEND_ONLY_BACKEND_CLASS",
    "SENTINEL_BACKEND_CLASS",
    "STORE_LUA",
    "FollowingSentinelBackend",
    "RedisBackend",
    "SendOnlyRedisBackend",
    "SentinelBackend",
    "reader_result_backend",
    "send_only_result_backend",
    "worker_result_backend",
]

#: This backend's class path, as Celery's ``result_backend`` names it before a URL.
BACKEND_CLASS = "cleveragents.broker.redis.result_backend:RedisBackend"

#: ``RedisBackend`` on Redis Sentinel, by class path.
SENTINEL_BACKEND_CLASS = "cleveragents.broker.redis.result_backend:SentinelBackend"

#: Celery's own Sentinel backend, following a failover at once, by class path.
FOLLOWING_SENTINEL_BACKEND_CLASS = (
    "cleveragents.broker.redis.result_backend:FollowingSentinelBackend"
)

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
    connparams: Any
    app: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # A connection whose peer vanished is found dead while idle, not after hours.
        if self.connparams.get("socket_keepalive"):
            self.connparams.setdefault("socket_keepalive_options", keepalive_options())

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

    @cached_property
    def replicas(self) -> ReplicaWait:
        """What a stored state waits for: a replica's acknowledgement
        (``result_backend_transport_options["replica_wait_ms"]``; 0: none)."""
        options = getattr(self.app.conf, "result_backend_transport_options", None) or {}
        return ReplicaWait(int(options.get("replica_wait_ms") or 0))

    def _store(self, key: str, value: Any, ttl: int, publish: bool) -> Any:
        args = [value, ttl, 1 if publish else 0]
        waits = self.replicas.commands
        if not waits:
            return self._store_script(keys=[key], args=args)
        # The state, then WAIT on the same connection: a failover right after the task
        # is acknowledged does not lose its result (stores/replication.py).
        with self.client.pipeline(transaction=False) as pipe:
            self._store_script(keys=[key], args=args, client=pipe)
            for command in waits:
                pipe.execute_command(*command)
            stored, *waited = pipe.execute(raise_on_error=False)
        self.replicas.check(waited)
        if isinstance(stored, Exception):
            raise stored
        return stored


class FollowingSentinelBackend(CelerySentinelBackend):  # type: ignore[misc]
    """Celery's Sentinel backend, its pool's connections cut as soon as the Sentinels
    name a new primary (``sentinel_follow.py``)."""

    def _get_pool(self, **params: Any) -> Any:
        return follow(super()._get_pool(**params))  # type: ignore[misc]


class SentinelBackend(RedisBackend, FollowingSentinelBackend):  # type: ignore[misc]
    """``RedisBackend`` on Redis Sentinel: the same one-script store, on the primary the
    Sentinels name (``result_backend_transport_options["master_name"]``)."""


def reader_result_backend(url: str) -> str:
    """The ``result_backend`` of a producer or a reader for ``url``: ``url`` itself, or
    on ``sentinel://`` ``FollowingSentinelBackend`` by class path."""
    if url.partition("://")[0].lower() == "sentinel":
        return f"{FOLLOWING_SENTINEL_BACKEND_CLASS}+{url}"
    return url


def worker_result_backend(url: str | None) -> str | None:
    """The ``result_backend`` a worker sets for ``url`` (None: keep it as it is)."""
    url = (url or "").removeprefix(f"{FOLLOWING_SENTINEL_BACKEND_CLASS}+")
    scheme = url.partition("://")[0].lower()
    if scheme == "sentinel":
        return f"{SENTINEL_BACKEND_CLASS}+{url}"
    if not url or scheme not in ("redis", "rediss", "redis+socket"):
        return None
    return f"{BACKEND_CLASS}+{_named(url)}"


def _named(url: str) -> str:
    # Behind a class path Celery reads the URL's own scheme: a socket is "socket://".
    return url[len("redis+") :] if url.lower().startswith("redis+socket://") else url


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
    return f"{SEND_ONLY_BACKEND_CLASS}+{_named(url)}"
