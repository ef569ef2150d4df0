"""The producer client: submit invocations and read their ``SkillResult``s.

It needs neither the catalogue nor the tools' code: only the broker and the
result backend (``CLEVERAGENTS_BROKER_URL`` / ``CLEVERAGENTS_RESULT_BACKEND``,
or the embedded default).
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import cached_property
from typing import Any

from celery import Celery
from celery.exceptions import TimeoutError as CeleryTimeoutError
from celery.result import AsyncResult
from kombu import exceptions as kombu_errors
from kombu.exceptions import BatchPublishError  # type: ignore[attr-defined]  # kombu 5.7; not in its stubs

from cleveragents.approvals.desk import ApprovalDesk
from cleveragents.approvals.model import Decision, Parked
from cleveragents.batch.batches import Batches
from cleveragents.broker import internals
from cleveragents.broker.celery_settings import (
    broker_of,
    celery_settings,
    consumer_transport,
    fallback_facts,
    needs_server,
)
from cleveragents.broker.queue_search import is_waiting
from cleveragents.broker.redis.liveness import holders_alive
from cleveragents.broker.signing import register_signing
from cleveragents.constants import (
    BATCH_HEADER,
    QUEUE_BATCH,
    QUEUE_BATCH_WRITE,
    QUEUE_READ,
    QUEUE_WRITE,
    SENT_AT_HEADER,
    STATE_AWAITING_APPROVAL,
    TASK_INVOKE,
    TASK_INVOKE_CHUNK,
)
from cleveragents.embedded.server import join_server, leave_server
from cleveragents.errors import RemoteControlUnavailable
from cleveragents.messages import (
    ChunkContext,
    chunk_repr,
    redacted_repr,
    request_payload,
    result_from_stored,
    result_payload,
    stored_payload,
)
from cleveragents.pipeline.binding import RequestIdReused, request_digest, reused_result
from cleveragents.runtime.invoke import parse_request
from cleveragents.runtime.request import SkillInvocationRequest
from cleveragents.settings import Settings
from cleveragents.skills import SkillResult
from cleveragents.stores import BatchLedger, ResultStore, Stores, open_stores
from cleveragents.stores.result_meta import refused_for_writes
from cleveragents.traces.carriers import carrier_of, current_carrier

__all__ = ["InvocationHandle", "NoWorkerRunning", "SkillClient"]

log = logging.getLogger("cleveragents.client")

#: Poll interval for result stores without push notifications.
POLL_INTERVAL_S = 0.02
#: The longest poll interval of a long wait on such a store.
MAX_POLL_INTERVAL_S = 0.25
#: How often a waiting client re-reads the store besides waiting for a notification.
RECHECK_S = 2.0
#: ``locate`` looks twice, this far apart, before it calls an id unknown.
LOCATE_RECHECK_S = 0.5
#: What ``locate`` says of an id nothing was sent under.
UNKNOWN = "UNKNOWN"
#: On the embedded default, how long a wait gives a worker to show up before it says none runs.
NO_WORKER_GRACE_S = 3.0


class NoWorkerRunning(TimeoutError):
    """No worker consumes the embedded default's queue, so nothing will answer."""


@dataclass(frozen=True)
class InvocationHandle:
    """A submitted invocation: its request id, and a way to its result."""

    request_id: str
    client: SkillClient
    #: Celery's AsyncResult from sending: already subscribed to the result, so waiting
    #: on it costs no new subscription.
    pending: Any = field(default=None, repr=False, compare=False)
    #: The answer given without sending: the request id was bound to other content.
    refused: SkillResult | None = field(default=None, compare=False)
    #: Sent with writes allowed: an earlier run's refusal for want of writes, still
    #: stored under the id until the worker replaces it, is not its answer.
    writes: bool = field(default=False, compare=False)

    def result(self, timeout: float | None = None) -> SkillResult:
        """Wait for the result (``TimeoutError`` after ``timeout`` seconds)."""
        if self.refused is not None:
            return self.refused
        return self.client.wait(
            self.request_id, timeout=timeout, pending=self.pending, writes=self.writes
        )

    def ready(self) -> bool:
        """True once the result is stored."""
        if self.refused is not None:
            return True
        found = self.client.get(self.request_id)
        return found is not None and _answers(found, self.writes)


def _refused_for_writes(result: SkillResult) -> bool:
    """Whether ``result`` is a refusal for want of writes (``stores/result_meta.py``)."""
    return result.error is not None and refused_for_writes(result_payload(result, ""))


def _answers(result: SkillResult, writes: bool) -> bool:
    """Whether ``result`` answers a request sent with (or without) writes allowed."""
    return not (writes and _refused_for_writes(result))


#: Version warnings this process has already logged (once each, not once per client).
_warned: set[str] = set()


def _warn_once(lines: tuple[str, ...]) -> None:
    for line in lines:
        if line not in _warned:
            _warned.add(line)
            log.warning("%s", line)


def _skip_declared_queue(app: Celery, producer: Any, options: dict[str, Any]) -> None:
    """Leave out the queue's declaration where this connection has declared it already.

    Celery asks kombu to declare the queue on every send, and kombu, before it looks at
    its cache of what the connection declared, binds a copy of the queue and wraps
    the declaration in its retries: about 35 us of the producer's CPU a submission (540
    to 505 us, 3,000 submissions in turns on a local Redis), for nothing after the
    first. The cache it looks at is this one (``declared_entities``,
    emptied when the connection is replaced), so the first send on each connection
    still declares.
    """
    name = options.get("queue")
    connection = getattr(producer, "connection", None)
    declared = getattr(connection, "declared_entities", None)
    if not isinstance(name, str) or declared is None or "declare" in options:
        return
    queue = app.amqp.queues.get(name)
    if queue is not None and hash(queue) in declared:
        options["declare"] = []


class SkillClient:
    """Submit skill invocations to the workers and collect their results.

    With message signing configured (``CLEVERAGENTS_SIGNING_*``, docs/security.md)
    every message it sends is signed with its key.

    Raises:
        ConfigurationError: on construction, when a setting in the environment is
            invalid, or the signing key, certificate or store do not load.
    """

    def __init__(
        self,
        broker_url: str | None = None,
        result_backend: str | None = None,
        *,
        settings: Settings | None = None,
    ) -> None:
        base = settings or Settings.from_env()
        if broker_url is not None or result_backend is not None:
            base = replace(
                base,
                broker_url=broker_url if broker_url is not None else base.broker_url,
                result_backend=result_backend
                if result_backend is not None
                else base.result_backend,
            )
        self.settings = base
        #: The trace its messages join when the application has no current span (the
        #: CLI sets the one its ``TRACEPARENT`` names): W3C fields, {} for none.
        self.trace_context: dict[str, str] = {}
        # Private Celery and kombu code only on the series it was written for: kombu's
        # own transport outside it, or no client at all (broker/internals.py).
        _warn_once(internals.check("producer", broker_of(base), fallback_facts(base)).warnings)
        if base.signing is not None:  # before anything is created: a bad key is one error
            register_signing(base.signing)
        #: The home's server this client uses (the embedded default), until ``close``.
        self._home = base.home if needs_server(base) else None
        if self._home is not None:
            join_server(self._home)
        self.app = Celery("cleveragents-client", set_as_current=False)
        self.app.conf.update(celery_settings(base, producer=True))
        transport = consumer_transport(base)
        if transport is not None:  # it rings the queue's doorbell as it publishes
            self.app.conf.broker_transport = transport

    def close(self) -> None:
        """Release the result backend's connections now, not when the collector finds them.

        The broker connection goes back to kombu's pool, which every client in the
        process shares (closing it would break the others).
        """
        app: Any = self.app  # its _backend: what it created, and nothing more
        backend = app._backend  # None when no result was ever looked at
        if backend is not None:
            consumer = getattr(backend, "result_consumer", None)
            if consumer is not None:
                # Forget the subscriptions first: a job collected later would otherwise
                # unsubscribe on a closed connection, and so open it again.
                consumer.subscribed_to.clear()
                consumer.stop()  # the result subscription
            redis_client = backend.__dict__.get("client")  # only if it was created
            if redis_client is not None:
                redis_client.connection_pool.disconnect()
        self.app.close()
        home, self._home = self._home, None
        if home is not None:
            leave_server(home)

    def __enter__(self) -> SkillClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
        raw: dict[str, Any] = {
            "skill": skill,
            "tool": tool,
            "arguments": dict(arguments or {}),
            "allow_writes": allow_writes,
            "timeout_s": timeout_s,
        }
        if request_id is not None:
            raw["request_id"] = request_id
        return parse_request(raw)

    def submit(
        self,
        skill: str | SkillInvocationRequest,
        tool: str | None = None,
        arguments: Mapping[str, Any] | None = None,
        *,
        allow_writes: bool = False,
        request_id: str | None = None,
        timeout_s: float | None = None,
    ) -> InvocationHandle:
        """Enqueue one invocation (a request, or skill and tool names) and return its handle."""
        if isinstance(skill, SkillInvocationRequest):
            request = skill
        else:
            request = self.build_request(
                skill,
                tool or "",
                arguments,
                allow_writes=allow_writes,
                request_id=request_id,
                timeout_s=timeout_s,
            )
        # A request id the caller chose may be finished already: then its stored
        # result is the answer and nothing is sent (a fresh UUID cannot be). It may
        # also be bound to another request: then nothing is sent either.
        chosen = request_id is not None or isinstance(skill, SkillInvocationRequest)
        try:
            pending = self.send(request, skip_if_done=chosen)
        except RequestIdReused as refused:
            return InvocationHandle(request.request_id, self, refused=refused.result)
        return InvocationHandle(request.request_id, self, pending, writes=request.allow_writes)

    def bound_elsewhere(self, requests: Sequence[SkillInvocationRequest]) -> list[bool]:
        """Bind each request's id to its content; True where the id was bound to other content.

        Such a request must not be sent: it would get the other request's result
        (``cleveragents.pipeline.binding``). One round trip for all of them.
        """
        digests = [request_digest(r) for r in requests]
        before = self.stores.guard.bind(
            [(r.request_id, d) for r, d in zip(requests, digests, strict=True)]
        )
        return [b is not None and b != d for b, d in zip(before, digests, strict=True)]

    def trace_headers(self, trace: Mapping[str, str] | None = None) -> dict[str, str]:
        """The trace context a message carries: ``trace`` (an MCP call's ``_meta``), else
        the application's current span (OpenTelemetry), else ``trace_context`` (the
        CLI's ``TRACEPARENT``); {} when there is none."""
        return carrier_of(trace) or current_carrier() or self.trace_context

    def send(
        self,
        request: SkillInvocationRequest,
        *,
        skip_if_done: bool = True,
        trace: Mapping[str, str] | None = None,
    ) -> Any:
        """Publish one request on its queue (writes travel on the write queue).

        With ``skip_if_done`` a request id that already has a stored result (that
        answers this request) is not sent again. Returns Celery's AsyncResult of
        the message, or None when nothing was sent.

        Raises:
            RequestIdReused: with ``skip_if_done``, when the id is bound to another
                request (other skill, tool or arguments); nothing was sent.
        """
        if skip_if_done:
            if self.bound_elsewhere([request]) == [True]:
                raise RequestIdReused(reused_result(request_payload(request)))
            [stored] = self.results.reusable([request.request_id], [request.allow_writes])
            if stored is not None:
                return None
        self._forget_late_messages(request.request_id)
        payload = request_payload(request)
        return self._send_task(
            TASK_INVOKE,
            args=[payload],
            task_id=request.request_id,
            queue=QUEUE_WRITE if request.allow_writes else QUEUE_READ,
            argsrepr=redacted_repr(payload),
            kwargsrepr="{}",
            headers={SENT_AT_HEADER: time.time(), **self.trace_headers(trace)},
        )

    def _send_task(self, name: str, **options: Any) -> Any:
        """``send_task``, with the message and its ``task-sent`` event in one round trip.

        On Redis kombu batches the two publishes into one pipeline; a transport
        that cannot (RabbitMQ) publishes them as before. A
        batch whose pipeline failed (delivery uncertain) is sent again the usual
        way, with kombu's retries: a message that did arrive twice carries the
        same id, and a worker runs an id once (``cleveragents.pipeline.binding``).
        """
        with self.app.producer_or_acquire() as producer:
            _skip_declared_queue(self.app, producer, options)
            try:
                with producer.batch():
                    return self.app.send_task(name, producer=producer, **options)
            except BatchPublishError as exc:
                log.warning("publishing %s again: %s", options.get("task_id") or name, exc)
                return self.app.send_task(name, producer=producer, **options)

    def _forget_late_messages(self, request_id: str) -> None:
        """Drop a result notification of an earlier run of ``request_id`` that arrived
        after its result was read: Celery keeps such a message and would answer the
        next wait on that id with it (the old result), not the run being sent now."""
        pending = getattr(self.app.backend, "_pending_messages", None)
        if pending is None:  # a backend without notifications
            return
        while pending.take(request_id, None) is not None:
            pass

    def send_chunk(
        self, requests: list[SkillInvocationRequest], context: ChunkContext | None = None
    ) -> str:
        """Publish many requests as one message on the batch queue (write queue if any writes).

        ``context`` (the batch id and the requests' item numbers) travels in a header;
        Flower shows it beside the chunk and each of its failed invocations. Returns
        the message's id.
        """
        payloads = [request_payload(r) for r in requests]
        writes = any(r.allow_writes for r in requests)
        headers: dict[str, Any] = {SENT_AT_HEADER: time.time(), **self.trace_headers()}
        if context is not None:
            headers[BATCH_HEADER] = context.header()
        sent = self._send_task(
            TASK_INVOKE_CHUNK,
            args=[payloads],
            queue=QUEUE_BATCH_WRITE if writes else QUEUE_BATCH,
            argsrepr=chunk_repr(payloads, context),
            kwargsrepr="{}",
            ignore_result=True,
            headers=headers,
        )
        return str(sent.id)

    def revoke(self, request_id: str, *, terminate: bool = False) -> bool:
        """Cancel an invocation: a queued one never starts; ``terminate`` stops a running one.

        A cancel mark beside its request-id binding, which a worker reads as it binds
        the id, before the run starts (the producer's Redis user may set it: nothing
        else is needed); its result is then a ``tool_execution_failure`` with
        ``details["reason"] == "cancelled"``. Then Celery's revoke is broadcast, which
        stops a running one (``terminate``) where this producer may use remote control;
        where it may not (the producer's Redis user), that is said in one warning line.
        """
        if not self.stores.guard.cancel(request_id):
            return False
        try:
            self.app.control.revoke(request_id, terminate=terminate, signal="SIGTERM")
        except kombu_errors.OperationalError as exc:
            log.warning(
                "cancelled %s: it will not start, but a run already started is not "
                "stopped: the revoke could not be broadcast to the workers (%s)",
                request_id,
                str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
            )
        return True

    @cached_property
    def stores(self) -> Stores:
        """The stores beside this client's result backend (chosen once, on first use)."""
        return open_stores(self.settings, self.app.backend)

    @property
    def results(self) -> ResultStore:
        """Bulk access to stored results (one round trip for many ids)."""
        return self.stores.results

    @property
    def ledger(self) -> BatchLedger:
        """Where background batches keep their ordered request ids."""
        return self.stores.ledger

    @cached_property
    def batches(self) -> Batches:
        """Many invocations at once: ``run_many``, ``submit``, ``status``, ``results``."""
        return Batches(self)

    @cached_property
    def approvals(self) -> ApprovalDesk:
        """Approvals and the audit trail: ``pending``, ``show``, ``approve``, ``reject``,
        ``audit`` (docs/approvals.md). Calling it (``client.approvals()``) is the old
        name of ``client.approvals.pending()``, kept for one release."""
        return ApprovalDesk(self.stores.approvals, self.send, self.stores.audit)

    def approve(
        self,
        request_id: str,
        *,
        digest: str | None = None,
        by: str | None = None,
        reason: str | None = None,
    ) -> Decision:
        """Approve a parked invocation: it runs once (``ApprovalError`` when it cannot).

        ``digest``: the content digest ``approvals.show`` showed (``content_digest`` of
        its body), or a prefix of 12 hex digits or more: refused when the call is no
        longer it. The same as ``client.approvals.approve`` (SPEC section 12 names it).
        """
        return self.approvals.approve(request_id, digest=digest, by=by, reason=reason)

    def run_many(
        self,
        requests: Iterable[SkillInvocationRequest | Mapping[str, Any]],
        **options: Any,
    ) -> Iterator[SkillResult]:
        """Deprecated: ``client.batches.run_many`` (kept for one release)."""
        _deprecated("run_many", "batches.run_many")
        return self.batches.run_many(requests, **options)

    def approval(self, request_id: str) -> tuple[Parked, Decision | None]:
        """Deprecated: ``client.approvals.show`` (kept for one release)."""
        _deprecated("approval", "approvals.show")
        return self.approvals.show(request_id)

    def reject(self, request_id: str, *, reason: str, by: str | None = None) -> Decision:
        """Deprecated: ``client.approvals.reject`` (kept for one release)."""
        _deprecated("reject", "approvals.reject")
        return self.approvals.reject(request_id, reason=reason, by=by)

    def audit(
        self, *, request_id: str | None = None, since: datetime | None = None
    ) -> Iterator[dict[str, str]]:
        """Deprecated: ``client.approvals.audit`` (kept for one release)."""
        _deprecated("audit", "approvals.audit")
        return self.approvals.audit(request_id=request_id, since=since)

    def state(self, request_id: str) -> str:
        """Celery's state of the invocation: PENDING, STARTED, SUCCESS, FAILURE, ..."""
        return str(AsyncResult(request_id, app=self.app).state)

    def consumers_of(self, queue: str) -> list[str] | None:
        """The running workers that consume ``queue`` (``inspect active_queues``).

        None when no worker answered within a second (none runs, or none can be asked).

        Raises:
            RemoteControlUnavailable: the broadcast failed or the broker refused it (the
                documented ``producer`` Redis user may not use remote control): who serves
                ``queue`` cannot be told, which is not "nobody".
        """
        try:
            replies = self.app.control.inspect(timeout=1.0).active_queues() or {}
        except Exception as exc:  # Redis' NoPermissionError, a lost connection, AMQP's refusal
            raise RemoteControlUnavailable(f"{type(exc).__name__}: {exc}") from exc
        if not replies:
            return None
        return sorted(
            name
            for name, queues in replies.items()
            if any(q.get("name") == queue for q in queues or [])
        )

    def locate(self, request_id: str) -> str:
        """Celery's state of an invocation with no result, or ``UNKNOWN`` for an id never sent.

        PENDING means sent and not yet started: the id is bound (the CLI, batches and
        chosen ids bind before sending; a worker binds what it takes), or its message
        waits in a queue (``cleveragents.broker.queue_search``). UNKNOWN means neither, looked at
        twice: a typo, or a result and binding that expired (``CLEVERAGENTS_RESULT_EXPIRES_S``).
        """
        for attempt in range(2):
            state = self.state(request_id)
            if state != "PENDING" or self.stores.guard.binding(request_id) is not None:
                return state
            if is_waiting(self.settings, request_id) is not False:
                return state  # waiting, or a broker that cannot be searched
            if self.get(request_id) is not None:
                return "SUCCESS"  # finished meanwhile
            if attempt == 0:  # a message between a queue and a worker's record of it
                time.sleep(LOCATE_RECHECK_S)
        return UNKNOWN

    def get(self, request_id: str) -> SkillResult | None:
        """The stored result, or None while there is none."""
        meta = self.app.backend.get_task_meta(request_id)
        if meta.get("status") not in ("SUCCESS", "FAILURE"):
            return None
        return result_from_stored(meta.get("result"), request_id)

    def trace_id(self, request_id: str) -> str | None:
        """The trace id a traced worker stored with the result (None: none stored)."""
        meta = self.app.backend.get_task_meta(request_id)
        if meta.get("status") not in ("SUCCESS", "FAILURE"):
            return None
        found = stored_payload(meta.get("result"), request_id).get("trace_id")
        return found if isinstance(found, str) else None

    def backend_redis(self) -> Any:
        """The result backend's Redis client (the embedded default's server)."""
        backend: Any = self.app.backend
        return backend.client

    def _no_result(self, request_id: str, timeout: float) -> str:
        """What a time-out says: the request id, and what to check."""
        if self.settings.embedded:
            check = (
                "on the embedded default no worker runs unless something starts one: run "
                "`cleveragents worker` in another terminal, or wrap the client's work in "
                "`with LocalWorker(client.settings):` (cleveragents.embedded.runner)"
            )
        else:
            check = (
                "is a worker consuming this broker (`celery -A worker inspect ping`), and "
                "is its queue backed up (`cleveragents metrics`)?"
            )
        return f"no result for {request_id} within {timeout:g}s: {check}"

    def _served_or_stored(self, request_id: str, deadline: float | None) -> SkillResult | None:
        """On the embedded default: the result if stored, None once a worker consumes.

        Nothing serves an embedded queue unless something started a worker: rather
        than wait out the whole time-out, say so after a short grace (a worker that
        is starting begins to consume within it).

        Raises:
            NoWorkerRunning: no worker consumes the embedded queue, and no result is stored.
        """
        grace_ends = time.monotonic() + NO_WORKER_GRACE_S
        while True:
            if holders_alive(self.backend_redis()):
                return None
            found = self.get(request_id)
            if found is not None:
                return found
            now = time.monotonic()
            if now >= grace_ends or (deadline is not None and now >= deadline):
                raise NoWorkerRunning(
                    f"no result for {request_id}, and no worker serves the embedded queue "
                    f"under {self.settings.home.resolve()}: run `cleveragents worker` in another "
                    "terminal (same folder, or the same CLEVERAGENTS_HOME), or wrap the "
                    "client's work in `with LocalWorker(client.settings):` "
                    "(cleveragents.embedded.runner); the request waits in the home's server "
                    "until then"
                )
            time.sleep(0.1)

    def wait(
        self,
        request_id: str,
        timeout: float | None = None,
        *,
        pending: Any = None,
        writes: bool = False,
        on_awaiting: Callable[[], None] | None = None,
    ) -> SkillResult:
        """Wait for the result of ``request_id`` (``pending``: the AsyncResult from sending).

        With ``writes`` (the request was sent with writes allowed) a stored refusal for
        want of writes is an earlier run's: it is read past until the re-run replaces it.
        ``on_awaiting`` is called once when the invocation is found waiting for approval
        (looked at every ``RECHECK_S``); the wait goes on.

        Raises:
            TimeoutError: no result within ``timeout`` seconds.
            NoWorkerRunning: (a TimeoutError) on the embedded default, no worker consumes
                its queue: said within a few seconds instead of at the time-out.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.settings.embedded:
            early = self._served_or_stored(request_id, deadline)
            if early is not None and _answers(early, writes):
                return early
        handle: AsyncResult = pending or AsyncResult(request_id, app=self.app)  # type: ignore[type-arg]
        interval = POLL_INTERVAL_S
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(self._no_result(request_id, timeout or 0.0))
            # Wait for Celery's notification, and re-read the store every few seconds:
            # the batch path stores results in bulk, without one.
            step = RECHECK_S if remaining is None else min(RECHECK_S, remaining)
            found, handle = self._wait_step(handle, request_id, step, interval, writes)
            if found is not None:
                return found
            if on_awaiting is not None and self.state(request_id) == STATE_AWAITING_APPROVAL:
                on_awaiting()
                on_awaiting = None
            # A store without notifications is polled: the longer the wait, the calmer.
            interval = min(interval * 2, MAX_POLL_INTERVAL_S)

    def _wait_step(
        self, handle: Any, request_id: str, step: float, interval: float, writes: bool
    ) -> tuple[SkillResult | None, Any]:
        """Wait at most ``step`` seconds: the answer if there is one, and the handle to
        wait on next."""
        try:
            value = handle.get(
                timeout=step, propagate=False, interval=interval, disable_sync_subtasks=False
            )
        except CeleryTimeoutError:
            found = self.get(request_id)
            return (found if found is not None and _answers(found, writes) else None), handle
        result = result_from_stored(value, request_id)
        if _answers(result, writes):
            return result, handle
        # An earlier run's refusal, until the worker replaces it: Celery keeps a finished
        # state, so a new handle, after a pause
        time.sleep(min(interval, step))
        return None, AsyncResult(request_id, app=self.app)


def _deprecated(old: str, new: str) -> None:
    warnings.warn(
        f"SkillClient.{old} is deprecated: use SkillClient.{new}",
        DeprecationWarning,
        stacklevel=3,
    )
