"""The producer client for asyncio: ``AsyncSkillClient``, on one event loop.

The same arguments, errors and promises as ``SkillClient`` (``cleveragents/client.py``), which it
drives for everything but waiting:

- **Sends** run in a small thread pool the client owns (``send_threads``, 4 by
  default), never on the loop: publishing through kombu is blocking, and so are the
  request-id binding and the look-up of a stored result that come before it
  (``SkillClient.submit``). The current OpenTelemetry context travels into the pool
  with the call (``contextvars``), so a span the caller is in becomes the parent of
  the invocation's ``execute_tool`` span.
- **Results** are awaited on the loop itself (``results.py``): on a Redis result
  backend one pub/sub connection for every awaited call, no thread and no poll per
  call; on a backend with no notifications (a ``sentinel://`` one) one
  polling task for all of them, its reads in the pool.

::

    async with AsyncSkillClient() as client:
        result = await client.invoke("local/text-tools", "local/word-count", {"text": "a b"})
        handles = [await client.submit("local/text-tools", "local/word-count", {"text": t})
                   for t in texts]
        results = await asyncio.gather(*(h.result(timeout=30) for h in handles))
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from cleveragents.aio.results import PolledResults, PubSubResults, ResultWaiter
from cleveragents.approvals.model import Decision
from cleveragents.broker.redis.liveness import holders_alive
from cleveragents.broker.redis.result_backend import send_only_result_backend
from cleveragents.client import NoWorkerRunning, SkillClient
from cleveragents.constants import STATE_AWAITING_APPROVAL
from cleveragents.runtime.request import SkillInvocationRequest
from cleveragents.settings import Settings
from cleveragents.skills import SkillResult

__all__ = ["AsyncInvocationHandle", "AsyncSkillClient"]

T = TypeVar("T")

#: Threads of a client's pool for sends (and the other blocking calls it makes).
SEND_THREADS = 4
#: On the embedded default, how long a wait gives a worker to show up before it says none runs.
NO_WORKER_GRACE_S = 3.0
#: Result backends whose stored states are published: awaited through pub/sub.
PUBSUB_SCHEMES = frozenset({"redis", "rediss", "redis+socket"})


@dataclass(frozen=True)
class AsyncInvocationHandle:
    """A submitted invocation: its request id, and a way to await its result."""

    request_id: str
    client: AsyncSkillClient = field(repr=False)
    #: The answer given without sending: the request id was bound to other content.
    refused: SkillResult | None = field(default=None, compare=False)
    #: Sent with writes allowed (an earlier run's refusal for want of writes is read past).
    writes: bool = field(default=False, compare=False)

    async def result(self, timeout: float | None = None) -> SkillResult:
        """Await the result (``TimeoutError`` after ``timeout`` seconds).

        Cancelling this await (``asyncio.CancelledError``, a ``wait_for`` or
        ``asyncio.timeout`` time-out, or ``timeout`` itself) stops the waiting, not the
        invocation: it runs on and its result is stored, to be read later with
        ``client.get`` or awaited again. ``await client.revoke(request_id)`` stops it.
        """
        if self.refused is not None:
            return self.refused
        return await self.client.wait(self.request_id, timeout, writes=self.writes)

    async def ready(self) -> bool:
        """True once the result is stored."""
        if self.refused is not None:
            return True
        return await self.client.get(self.request_id) is not None

    async def state(self) -> str:
        """Celery's state: PENDING, STARTED, SUCCESS, ..., or ``AWAITING_APPROVAL`` while
        the call is parked for a person's decision."""
        return await self.client.state(self.request_id)

    async def revoke(self, *, terminate: bool = False) -> bool:
        """Stop the invocation (``AsyncSkillClient.revoke``)."""
        return await self.client.revoke(self.request_id, terminate=terminate)


def _redis_py(url: str) -> str:
    """A Celery result backend's URL as redis-py names it (a socket is ``unix://``)."""
    scheme, _, rest = url.partition("://")
    return f"unix://{rest}" if scheme.lower() == "redis+socket" else url


class AsyncSkillClient:
    """Submit skill invocations and await their results on one event loop.

    ``async with AsyncSkillClient() as client`` (or ``await client.aclose()`` at the
    end). The settings are ``SkillClient``'s (``broker_url``, ``result_backend``,
    ``settings``, else the environment); ``client.sync`` is the ``SkillClient`` it
    drives, for what has no coroutine here (``client.sync.approvals.pending()``).

    Raises:
        ConfigurationError: on construction, as ``SkillClient``.
    """

    def __init__(
        self,
        broker_url: str | None = None,
        result_backend: str | None = None,
        *,
        settings: Settings | None = None,
        send_threads: int = SEND_THREADS,
    ) -> None:
        self.sync = SkillClient(broker_url, result_backend, settings=settings)
        self.settings = self.sync.settings
        backend_url = str(self.sync.app.conf.result_backend or "")
        scheme = backend_url.partition("://")[0].lower()
        #: The Redis whose published states are awaited (as redis-py names it); None:
        #: the store is polled.
        self.pubsub_url = _redis_py(backend_url) if scheme in PUBSUB_SCHEMES else None
        if self.pubsub_url is not None:
            # Celery would subscribe its own (blocking) connection to every id it sends.
            self.sync.app.conf.update(result_backend=send_only_result_backend(backend_url))
        self._pool = ThreadPoolExecutor(send_threads, thread_name_prefix="cleveragents-send")
        self._waiter: ResultWaiter | None = None
        self._closed = False

    # ------------------------------------------------------------------ life

    async def __aenter__(self) -> AsyncSkillClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop every wait under way, release the connections and the thread pool."""
        if self._closed:
            return
        self._closed = True
        if self._waiter is not None:
            await self._waiter.close()
        await self._run(self.sync.close)
        self._pool.shutdown(wait=False)

    @property
    def results_by(self) -> str:
        """How results are awaited: ``pubsub`` (Redis) or ``poll`` (a store without
        notifications)."""
        return "pubsub" if self.pubsub_url is not None else "poll"

    def _results(self) -> ResultWaiter:
        if self._waiter is None:
            if self.pubsub_url is not None:
                backend: Any = self.sync.app.backend
                self._waiter = PubSubResults(
                    self.pubsub_url,
                    key_of=lambda rid: str(backend.get_key_for_task(rid).decode()),
                    decode=backend.decode_result,
                )
            else:
                self._waiter = PolledResults(self._read_many, self._run)
        return self._waiter

    def _read_many(self, request_ids: list[str]) -> list[SkillResult | None]:
        return [self.sync.get(request_id) for request_id in request_ids]

    async def _run(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``call`` in the client's pool, in the caller's context (its current span)."""
        context = contextvars.copy_context()
        bound = functools.partial(context.run, call, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._pool, bound)

    # ------------------------------------------------------------------ sending

    def build_request(
        self,
        skill: str,
        tool: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        allow_writes: bool = False,
        request_id: str | None = None,
        timeout_s: float | None = None,
    ) -> SkillInvocationRequest:
        """A validated request (``SchemaValidationError`` when it is not valid)."""
        return self.sync.build_request(
            skill,
            tool,
            arguments,
            allow_writes=allow_writes,
            request_id=request_id,
            timeout_s=timeout_s,
        )

    async def submit(
        self,
        skill: str | SkillInvocationRequest,
        tool: str | None = None,
        arguments: Mapping[str, Any] | None = None,
        *,
        allow_writes: bool = False,
        request_id: str | None = None,
        timeout_s: float | None = None,
    ) -> AsyncInvocationHandle:
        """Enqueue one invocation and return its handle, as ``SkillClient.submit``.

        A request id bound to other content is not sent: its handle's result is the
        ``validation_error`` (reason ``request_id_reused``) at once. A chosen id whose
        result is stored already is not sent again. Writes travel on the write queue.

        Raises:
            SchemaValidationError: the request is not valid (nothing was sent).
        """
        sent = await self._run(
            self.sync.submit,
            skill,
            tool,
            arguments,
            allow_writes=allow_writes,
            request_id=request_id,
            timeout_s=timeout_s,
        )
        return AsyncInvocationHandle(
            sent.request_id, self, refused=sent.refused, writes=sent.writes
        )

    async def invoke(
        self,
        skill: str | SkillInvocationRequest,
        tool: str | None = None,
        arguments: Mapping[str, Any] | None = None,
        *,
        allow_writes: bool = False,
        request_id: str | None = None,
        timeout_s: float | None = None,
        timeout: float | None = None,
    ) -> SkillResult:
        """Submit one invocation and await its ``SkillResult`` (``timeout``: of the wait).

        ``timeout_s`` bounds the tool's run on the worker; ``timeout`` this wait
        (``TimeoutError``). Cancelling the await stops the waiting, not the invocation
        (``AsyncInvocationHandle.result``); ``await client.revoke(request_id)`` stops it.
        """
        handle = await self.submit(
            skill,
            tool,
            arguments,
            allow_writes=allow_writes,
            request_id=request_id,
            timeout_s=timeout_s,
        )
        return await handle.result(timeout)

    # ------------------------------------------------------------------ results

    async def get(self, request_id: str) -> SkillResult | None:
        """The stored result, or None while there is none."""
        return await self._results().get(request_id)

    async def wait(
        self, request_id: str, timeout: float | None = None, *, writes: bool = False
    ) -> SkillResult:
        """Await the result of ``request_id`` (``writes``: it was sent with writes allowed).

        Cancelling this await stops the waiting, not the invocation
        (``AsyncInvocationHandle.result``).

        Raises:
            TimeoutError: no result within ``timeout`` seconds; the message says when the
                call is parked awaiting approval.
            NoWorkerRunning: (a TimeoutError) on the embedded default, no worker consumes
                its queue: said within a few seconds instead of at the time-out.
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        waiting = loop.create_task(self._results().wait(request_id, writes=writes))
        try:
            if self.settings.embedded:
                await self._served(request_id, waiting, deadline)
            async with asyncio.timeout_at(deadline):
                return await waiting
        except TimeoutError as exc:
            if isinstance(exc, NoWorkerRunning):
                raise
            raise TimeoutError(await self._no_result(request_id, timeout or 0.0)) from None
        finally:
            waiting.cancel()

    async def _served(
        self, request_id: str, waiting: asyncio.Task[SkillResult], deadline: float | None
    ) -> None:
        """Raise ``NoWorkerRunning`` when, after a short grace, no worker consumes the
        embedded queue and the result has not come."""
        loop = asyncio.get_running_loop()
        grace = NO_WORKER_GRACE_S if deadline is None else min(
            NO_WORKER_GRACE_S, max(0.0, deadline - loop.time())
        )
        await asyncio.wait({waiting}, timeout=grace)
        if waiting.done():
            return
        if await self._run(holders_alive, self.sync.backend_redis()):
            return
        raise NoWorkerRunning(
            f"no result for {request_id}, and no worker serves the embedded queue under "
            f"{self.settings.home.resolve()}: run `cleveragents worker` in another terminal "
            "(same folder, or the same CLEVERAGENTS_HOME), or wrap the work in "
            "`with LocalWorker(client.settings):` (cleveragents.embedded.runner); the "
            "request waits in the home's server until then"
        )

    async def _no_result(self, request_id: str, timeout: float) -> str:
        """What a time-out says: the request id, and what to do."""
        try:
            state = await self.state(request_id)
        except Exception:  # the time-out is the news; a failed look is not
            state = ""
        if state == STATE_AWAITING_APPROVAL:
            return (
                f"{request_id} is awaiting approval: a person approves it "
                f"(`cleveragents approvals approve {request_id}`) or rejects it; it stays "
                f"parked, and waiting again (or `get`) returns its result once decided "
                f"(waited {timeout:g}s)"
            )
        return (
            f"no result for {request_id} within {timeout:g}s (state {state or 'unknown'}): "
            "is a worker consuming this broker, and is its queue backed up "
            "(`cleveragents metrics`)? The invocation was not stopped"
        )

    async def state(self, request_id: str) -> str:
        """Celery's state of the invocation (``AWAITING_APPROVAL`` while parked)."""
        return await self._run(self.sync.state, request_id)

    # ------------------------------------------------------------------ control

    async def revoke(self, request_id: str, *, terminate: bool = False) -> bool:
        """Cancel an invocation, as ``SkillClient.revoke``: a queued one never starts;
        ``terminate`` stops a running one."""
        return await self._run(self.sync.revoke, request_id, terminate=terminate)

    async def approve(
        self,
        request_id: str,
        *,
        digest: str | None = None,
        by: str | None = None,
        reason: str | None = None,
    ) -> Decision:
        """Approve a parked invocation, as ``SkillClient.approve`` (``ApprovalError``)."""
        return await self._run(
            self.sync.approve, request_id, digest=digest, by=by, reason=reason
        )

    async def reject(self, request_id: str, *, reason: str, by: str | None = None) -> Decision:
        """Reject a parked invocation: its result is a ``permission_denied``."""
        return await self._run(self.sync.approvals.reject, request_id, reason=reason, by=by)

    # ------------------------------------------------------------------ batches

    async def run_many(
        self,
        requests: Iterable[SkillInvocationRequest | Mapping[str, Any]],
        *,
        chunk_size: int | None = None,
        reuse: bool = True,
        batch_id: str | None = None,
    ) -> AsyncIterator[SkillResult]:
        """Run many requests in chunks; yield their results in input order as they are
        ready (``async for result in client.run_many(requests)``).

        The batch path of ``SkillClient.batches.run_many`` (chunks on the batch queue,
        results read in bulk, stored results reused unless ``reuse=False``), stepped in
        the client's pool: one thread for the whole batch, none per request; the loop
        runs between two results. Leaving the loop early stops sending.
        """
        batch: Iterator[SkillResult] = self.sync.batches.run_many(
            requests, chunk_size=chunk_size, reuse=reuse, batch_id=batch_id
        )
        done = object()
        try:
            while True:
                item = await self._run(next, batch, done)
                if item is done:
                    return
                yield item  # type: ignore[misc]
        finally:
            close = getattr(batch, "close", None)
            if close is not None:
                await self._run(close)
