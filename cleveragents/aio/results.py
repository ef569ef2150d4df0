"""Awaiting many invocations' results on one event loop (for ``AsyncSkillClient``).

Two ways, one chosen when the client opens (``open_results``):

- ``PubSubResults``, on a Redis result backend (``redis://``, ``rediss://``, the
  embedded default's server on its socket). As a
  worker stores a finished state it PUBLISHes it on the ``celery-task-meta-<id>``
  channel (Celery's Redis backend, and ours: ``broker/redis/result_backend.py``).
  One ``redis.asyncio`` pub/sub connection is subscribed to the channels of the ids
  being awaited, and one task reads it; once channels' subscriptions are confirmed,
  one MGET of their keys catches results stored before them. Every ``RECHECK_S``
  one MGET reads every awaited key: a batch line's result is stored in bulk without a message, and a
  message published while the connection was down is lost. No thread and no poll per
  call: 200 awaited calls are 200 futures and 200 channels on one connection, and the
  reads after their subscriptions are a few MGETs.
- ``PolledResults``, on any other backend (a ``sentinel://`` one): no notifications to
  wait for, so one task polls, reading every id that is due in one call in the
  client's executor (reads block); each id is
  read first after 20 ms, then at intervals doubling to 250 ms, as ``SkillClient.wait``
  polls such a store.

Either way, a result that answers a request sent with writes allowed is never an
earlier run's refusal for want of writes (``stores/result_meta.py``): that one is read
past until the re-run replaces it, as ``SkillClient.wait`` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from redis import asyncio as aioredis
from redis.exceptions import RedisError

from cleveragents.messages import result_from_stored, result_payload
from cleveragents.skills import SkillResult
from cleveragents.stores.result_meta import refused_for_writes

__all__ = [
    "FIRST_POLL_S",
    "MAX_POLL_S",
    "RECHECK_S",
    "PolledResults",
    "PubSubResults",
    "ResultWaiter",
    "answers",
]

log = logging.getLogger("cleveragents.client")

#: How often every awaited key is read in one MGET besides waiting for its message.
RECHECK_S = 2.0
#: A polled store: the first read of an id, and the longest interval between two.
FIRST_POLL_S = 0.02
MAX_POLL_S = 0.25
#: Pause after the pub/sub connection failed, before reading it again (redis-py reconnects
#: and subscribes again to every channel).
RECONNECT_PAUSE_S = 0.5
#: Connections for GETs and MGETs, besides the pub/sub one.
POOL_SIZE = 8
#: Keys an MGET reads at most at once.
MGET_CHUNK = 1000
#: Celery's finished states: a stored state that is one of them is a result.
READY_STATES = frozenset({"SUCCESS", "FAILURE"})


def answers(result: SkillResult, writes: bool) -> bool:
    """Whether ``result`` answers a request sent with (or without) writes allowed."""
    if not writes or result.error is None:
        return True
    return not refused_for_writes(result_payload(result, ""))


class ResultWaiter(Protocol):
    """Where an async client awaits results: one per client, on its event loop."""

    async def wait(self, request_id: str, *, writes: bool) -> SkillResult:
        """The result of ``request_id`` once stored (no time-out: the caller sets one)."""

    async def get(self, request_id: str) -> SkillResult | None:
        """The stored result, or None while there is none."""

    async def close(self) -> None:
        """Stop waiting for anything and release the connections."""


@dataclass(eq=False)
class _Waiter:
    request_id: str
    writes: bool
    future: asyncio.Future[SkillResult]


@dataclass(eq=False)
class _Channel:
    """The waiters of one id."""

    request_id: str
    waiters: list[_Waiter] = field(default_factory=list)


def _settle(waiters: Sequence[_Waiter], result: SkillResult) -> None:
    for waiter in waiters:
        if not waiter.future.done() and answers(result, waiter.writes):
            waiter.future.set_result(result)


class PubSubResults:
    """Results awaited through Redis pub/sub on one connection (module docstring).

    ``key_of`` names an id's key (and channel) as Celery's backend does; ``decode``
    turns what it stores into its meta (``status``, ``result``): both are the
    producer's Celery backend's, so prefixes and serializers stay Celery's.
    """

    def __init__(
        self,
        url: str,
        *,
        key_of: Callable[[str], str],
        decode: Callable[[bytes | str], dict[str, Any]],
    ) -> None:
        # A few connections for the GETs and MGETs; a burst of ``get`` waits for one.
        pool = aioredis.BlockingConnectionPool.from_url(url, max_connections=POOL_SIZE)
        self._redis = aioredis.Redis.from_pool(pool)  # closed with it
        self._pubsub = self._redis.pubsub()
        self._key_of = key_of
        self._decode = decode
        self._channels: dict[str, _Channel] = {}
        #: Keys whose subscription the server confirmed, to be read once (in one MGET).
        self._fresh: set[str] = set()
        #: Keys to subscribe to, sent together by whichever waiter holds the lock first.
        self._unsent: set[str] = set()
        self._subscribing = asyncio.Lock()
        self._reader: asyncio.Task[None] | None = None

    async def wait(self, request_id: str, *, writes: bool) -> SkillResult:
        key = self._key_of(request_id)
        waiter = _Waiter(request_id, writes, asyncio.get_running_loop().create_future())
        channel = self._channels.get(key)
        first = channel is None
        if channel is None:
            channel = self._channels[key] = _Channel(request_id)
        channel.waiters.append(waiter)
        try:
            if first:
                self._unsent.add(key)
                await self._subscribe()
            return await waiter.future
        finally:
            await self._forget(key, waiter)

    async def get(self, request_id: str) -> SkillResult | None:
        raw = await self._redis.get(self._key_of(request_id))
        return None if raw is None else self._result_of(raw, request_id)

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
            self._reader = None
        for channel in self._channels.values():
            for waiter in channel.waiters:
                waiter.future.cancel()
        self._channels.clear()
        await self._pubsub.aclose()
        await self._redis.aclose()

    async def _subscribe(self) -> None:
        """Send every pending subscription in one SUBSCRIBE (one at a time: redis-py's
        pub/sub opens its connection on the first command, and many first commands at
        once would each open one)."""
        async with self._subscribing:
            keys = [k for k in self._unsent if k in self._channels]
            self._unsent.clear()
            if not keys:
                return
            try:
                await self._pubsub.subscribe(*keys)
            finally:  # sent or not, a reader for the channels that are
                if self._pubsub.connection is not None:
                    self._start_reader()

    def _start_reader(self) -> None:
        if self._reader is None or self._reader.done():
            self._reader = asyncio.get_running_loop().create_task(
                self._read(), name="cleveragents-results"
            )

    async def _forget(self, key: str, waiter: _Waiter) -> None:
        channel = self._channels.get(key)
        if channel is None:
            return
        if waiter in channel.waiters:
            channel.waiters.remove(waiter)
        if not channel.waiters:
            del self._channels[key]
            try:
                await self._pubsub.unsubscribe(key)
            except (RedisError, OSError) as exc:  # dropped when the connection comes back
                log.debug("unsubscribe %s: %s", key, exc)

    def _result_of(self, raw: bytes | str, request_id: str) -> SkillResult | None:
        meta = self._decode(raw)
        if meta.get("status") not in READY_STATES:
            return None
        return result_from_stored(meta.get("result"), request_id)

    def _store_read(self, key: str, raw: bytes | str | None) -> None:
        channel = self._channels.get(key)
        if raw is None or channel is None:
            return
        result = self._result_of(raw, channel.request_id)
        if result is not None:
            _settle(channel.waiters, result)

    async def _read(self) -> None:
        """The one reader: messages as they come, and every key re-read each ``RECHECK_S``."""
        loop = asyncio.get_running_loop()
        recheck_at = loop.time() + RECHECK_S
        while True:
            try:
                # What has arrived first; then the keys newly subscribed, in one MGET.
                message = await self._pubsub.get_message(
                    timeout=0 if self._fresh else RECHECK_S
                )
                if message is not None:
                    self._on_message(message)
                    if len(self._fresh) < MGET_CHUNK:
                        continue
                if self._fresh:
                    fresh = list(self._fresh)
                    self._fresh.clear()
                    await self._read_keys(fresh)
                if loop.time() >= recheck_at:
                    await self._read_keys(list(self._channels))
                    recheck_at = loop.time() + RECHECK_S
            except (RedisError, OSError) as exc:
                log.warning("result subscription: %s; reading again", exc)
                await asyncio.sleep(RECONNECT_PAUSE_S)

    def _on_message(self, message: dict[str, Any]) -> None:
        name = message.get("channel")
        key = name.decode() if isinstance(name, bytes) else str(name)
        kind = message.get("type")
        channel = self._channels.get(key)
        if channel is None:
            return
        if kind == "subscribe":
            # Subscribed (the server said so) before the read: a result stored after
            # the read is published to this connection, one stored before it is read.
            self._fresh.add(key)
        elif kind == "message" and isinstance(message.get("data"), bytes | str):
            self._store_read(key, message["data"])

    async def _read_keys(self, keys: list[str]) -> None:
        for start in range(0, len(keys), MGET_CHUNK):
            chunk = keys[start : start + MGET_CHUNK]
            for key, raw in zip(chunk, await self._redis.mget(chunk), strict=True):
                self._store_read(key, raw)


class PolledResults:
    """Results polled by one task on the loop, every read in the executor (module docstring).

    ``read_many`` reads the results of many ids in one call (blocking: it runs in
    ``run``, the client's executor).
    """

    def __init__(
        self,
        read_many: Callable[[list[str]], list[SkillResult | None]],
        run: Callable[..., Awaitable[Any]],
    ) -> None:
        self._read_many = read_many
        self._run = run
        self._waiters: dict[str, list[_Waiter]] = {}
        #: When each id is read next, and the interval after that read.
        self._due: dict[str, tuple[float, float]] = {}
        self._wake = asyncio.Event()
        self._poller: asyncio.Task[None] | None = None

    async def wait(self, request_id: str, *, writes: bool) -> SkillResult:
        loop = asyncio.get_running_loop()
        waiter = _Waiter(request_id, writes, loop.create_future())
        self._waiters.setdefault(request_id, []).append(waiter)
        self._due[request_id] = (loop.time() + FIRST_POLL_S, FIRST_POLL_S)
        self._wake.set()
        if self._poller is None or self._poller.done():
            self._poller = loop.create_task(self._poll(), name="cleveragents-results-poll")
        try:
            return await waiter.future
        finally:
            waiters = self._waiters.get(request_id, [])
            if waiter in waiters:
                waiters.remove(waiter)
            if not waiters:
                self._waiters.pop(request_id, None)
                self._due.pop(request_id, None)

    async def get(self, request_id: str) -> SkillResult | None:
        [found] = await self._run(self._read_many, [request_id])
        return found  # type: ignore[no-any-return]

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
            self._poller = None
        for waiters in self._waiters.values():
            for waiter in waiters:
                waiter.future.cancel()
        self._waiters.clear()
        self._due.clear()

    async def _poll(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._wake.clear()
            if not self._due:
                await self._wake.wait()
                continue
            now = loop.time()
            due = [rid for rid, (at, _) in self._due.items() if at <= now]
            if not due:
                first = min(at for at, _ in self._due.values())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=first - now)
                continue
            try:
                found = await self._run(self._read_many, due)
            except Exception as exc:  # a store away: read again at the next turn
                log.warning("reading results: %s", exc)
                found = [None] * len(due)
            now = loop.time()
            for request_id, result in zip(due, found, strict=True):
                if result is not None:
                    _settle(self._waiters.get(request_id, []), result)
                if request_id in self._due:
                    interval = min(self._due[request_id][1] * 2, MAX_POLL_S)
                    self._due[request_id] = (now + interval, interval)
