"""The worker's message consumer: undecodable or disallowed messages still get a result.

Celery acks (or rejects) such a message and logs its body. Here the body is
never logged (it can hold secrets), and when the message's headers carry a
task id, a ``validation_error`` ``SkillResult`` is stored under it, so the
producer waiting on that id learns what happened instead of waiting for ever.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.worker.consumer import Consumer

from cleveragents.broker.internals import InternalsRefused, fix
from cleveragents.broker.signing import SIGNED_CONTENT_TYPE, SIGNED_SERIALIZER
from cleveragents.constants import QUEUE_BATCH_WRITE, QUEUE_WRITE
from cleveragents.errors import SkillErrorType
from cleveragents.messages import SkillInvocationFailed, failure_summary, result_payload
from cleveragents.runtime.outcomes import failed_result
from cleveragents.runtime.text import lone_surrogate, writable
from cleveragents.worker import state
from cleveragents.worker.admission import (
    ACCEPTED_CONTENT_TYPE,
    admission_problem,
    envelope_problem,
    refuse_compressed_bodies,
    sanitise,
    signed_id_problem,
)
from cleveragents.worker.heartbeat import BOUNDED_HEART, HEART_STEP

__all__ = ["SkillConsumer", "check_steps"]

#: Queues of invocations that may write: never consumed by a read-only worker.
WRITE_QUEUES = frozenset({QUEUE_WRITE, QUEUE_BATCH_WRITE})

log = logging.getLogger("cleveragents.worker")

#: Celery's remote control step, by the name its consumer blueprint lists (Celery 5.7),
#: and the guarded one that replaces it (worker/remote_control.py).
CONTROL_STEP = "celery.worker.consumer.control:Control"
GUARDED_CONTROL = "cleveragents.worker.remote_control:GuardedControl"
#: Celery's steps this consumer replaces, and with what.
REPLACED_STEPS = {CONTROL_STEP: GUARDED_CONTROL, HEART_STEP: BOUNDED_HEART}
#: Native delayed delivery, left out (below).
DELAYED_DELIVERY_STEP = "celery.worker.consumer.delayed_delivery:DelayedDelivery"
#: Gossip and mingle are off, as ``--without-gossip --without-mingle`` turn them off
#: (below): the options Celery's worker passes its consumer, which hands them to its steps.
QUIET_STEPS = {"without_gossip": True, "without_mingle": True}


def check_steps(steps: tuple[str, ...] | list[str] | None = None) -> None:
    """Refuse a Celery whose consumer no longer lists a replaced step by its name.

    A renamed step would leave remote control unguarded, or the heartbeat able to
    hold the event loop, without a word.

    Raises:
        InternalsRefused: a replaced step is not among Celery's consumer steps.
    """
    listed = Consumer.Blueprint.default_steps if steps is None else steps
    if CONTROL_STEP not in listed:
        raise InternalsRefused(
            f"Celery's consumer no longer has the step {CONTROL_STEP!r}, which the worker "
            f"replaces to guard remote control: it would run unguarded. {fix('consumer')}"
        )
    if HEART_STEP not in listed:
        raise InternalsRefused(
            f"Celery's consumer no longer has the step {HEART_STEP!r}, which the worker "
            f"replaces so that a heartbeat cannot hold its event loop. {fix('consumer')}"
        )


#: Longest a task event waits in the worker before it is sent (with the others due).
EVENT_FLUSH_S = 0.05
#: How a worker that lost its broker tries again: at once, then every 0.5 s more, at
#: most every 1 s (kombu's default is 2 s more each time, up to 30 s: a Redis back,
#: or a Sentinel failover done, 3 s after the loss was found by a worker 6 to 12 s
#: later, and the longer the outage the longer the wait after it).
RECONNECT_INTERVALS = {"interval_start": 0.0, "interval_step": 0.5, "interval_max": 1.0}


def _task_id(message: Any) -> str | None:
    headers = getattr(message, "headers", None) or {}
    value = headers.get("id")
    return value if isinstance(value, str) and value else None


class SkillConsumer(Consumer):  # type: ignore[misc]
    """A consumer that answers a bad message with a ``validation_error`` result."""

    class Blueprint(Consumer.Blueprint):  # type: ignore[misc,valid-type]
        """Celery's consumer steps, with remote control guarded (``worker/remote_control.py``)
        and the heartbeat's retries bounded (``worker/heartbeat.py``).

        Without native delayed delivery: Celery adds it on RabbitMQ with quorum queues,
        where it declares 28 exchanges and 28 quorum queues per virtual host, and binds
        the skill queues to them, for messages with an ETA. No skill message has one:
        the worker drops ``eta`` and ``countdown`` (cleveragents/worker/admission.py).
        """

        default_steps = [
            REPLACED_STEPS.get(step, step)
            for step in Consumer.Blueprint.default_steps
            if step != DELAYED_DELIVERY_STEP
        ]

    def ensure_connected(self, conn: Any) -> Any:
        """Celery's, with ``RECONNECT_INTERVALS`` between the attempts to reach the broker."""
        ensure = conn.ensure_connection

        def ensure_soon(*args: Any, **kwargs: Any) -> Any:
            return ensure(*args, **{**RECONNECT_INTERVALS, **kwargs})

        conn.ensure_connection = ensure_soon
        return super().ensure_connected(conn)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        refuse_compressed_bodies()  # at worker start, in the process that decodes messages
        # Without gossip and mingle, whatever the command line says: nothing of the
        # product uses them (docs/operations.md, "A log an operator can trust").
        # Gossip follows the other workers' events, for Celery's leader elections and
        # "missed heartbeat" lines; Flower reads the events itself, and a dead worker's
        # invocations come back by the broker's recovery. Mingle asks the running
        # workers for their revoked ids as a worker starts: a cancelled invocation is
        # refused by its cancel mark in Redis, which every worker reads. Gossip logged
        # an ERROR with a traceback on Redis restarts ("Error on restarting Gossip"),
        # mingle two lines on each reconnection and a second at each start.
        kwargs["worker_options"] = {**(kwargs.get("worker_options") or {}), **QUIET_STEPS}
        super().__init__(*args, **kwargs)
        self._events_due = False  # a flush of the buffered task events is on the timer
        if state.current().settings.read_only:
            self._leave_write_queues()
        # With message signing on, signed messages are the only ones admitted.
        self.signed_only = self.app.conf.task_serializer == SIGNED_SERIALIZER
        self.admitted_content_type = (
            SIGNED_CONTENT_TYPE if self.signed_only else ACCEPTED_CONTENT_TYPE
        )

    # Celery's, absent from its stubs.
    hub: Any
    _flush_events: Any

    def on_send_event_buffered(self) -> None:  # type: ignore[override]
        """Send the buffered task events together, ``EVENT_FLUSH_S`` after the first.

        Celery flushes them at the next turn of the event loop: two or three messages
        per invocation (received, started, succeeded), each a round trip to the
        broker. Gathered for a moment they go out as one ``task.multi`` message (or
        when 24 are waiting: Celery's buffer limit); every event keeps the time it
        happened at, which is what Flower shows.
        """
        if self.hub is None or self._events_due:
            return
        self._events_due = True
        self.hub.call_later(EVENT_FLUSH_S, self._send_due_events)

    def _send_due_events(self) -> None:
        self._events_due = False
        self._flush_events()

    def stop(self) -> None:
        """Send the buffered task events, then stop as Celery does."""
        self._send_events_now()
        super().stop()

    def shutdown(self) -> None:
        """Send the buffered task events, then shut down as Celery does."""
        self._send_events_now()
        super().shutdown()

    def _send_events_now(self) -> None:
        try:
            self._flush_events()
        except Exception as exc:  # a broker that is gone: nothing more to tell Flower
            log.debug("could not send the last task events: %s", exc)

    def _leave_write_queues(self) -> None:
        # On RabbitMQ every process knows all four skill queues (a queue's arguments are
        # fixed by whoever declares it first, so each declaration must be the same), and
        # a read-only worker starts without the write queues here. On Redis its queues
        # hold none (celery_settings._queues): nothing to leave. A worker told to
        # consume a write queue with -Q still does (and its gate refuses every write).
        queues = self.app.amqp.queues
        if set(queues.consume_from) == set(queues):  # Celery's default: no -Q given
            queues.deselect([name for name in WRITE_QUEUES if name in queues])

    def add_task_queue(self, queue: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        """Consume one more queue; a read-only worker never takes a write queue."""
        name = getattr(queue, "name", queue)
        if name in WRITE_QUEUES and state.current().settings.read_only:
            log.warning("a read-only worker does not consume the write queue %r", name)
            return None
        return super().add_task_queue(queue, *args, **kwargs)

    def create_task_handler(self, *args: Any, **kwargs: Any) -> Any:
        """Celery's handler, behind checks that refuse bad messages undecoded.

        Too large, compressed, not JSON (or with signing on, not signed JSON, or
        signed by no certificate of the store), or not one of our tasks
        (cleveragents/worker/admission.py): answered with a ``validation_error`` and acked, the
        body never logged.
        kombu passes "raw" content types (``text/plain``, ...) through undecoded and
        Celery then fails on them outside its own error handling, stopping the
        consumer; any other error of a malformed envelope is contained the same way.
        """
        handler = super().create_task_handler(*args, **kwargs)

        def refuse(message: Any, why: str) -> None:
            self._answer(message, why)
            message.ack()

        def on_task_received(message: Any) -> Any:
            problem = admission_problem(message, self.admitted_content_type)
            if problem is not None:
                return refuse(message, problem)
            try:
                problem = envelope_problem(message)
                if problem is None and self.signed_only:
                    problem = signed_id_problem(message)
                if problem is not None:
                    return refuse(message, problem)
                sanitise(message)
                return handler(message)
            except self.connection_errors:  # type: ignore[attr-defined]
                raise
            except Exception as exc:
                return refuse(message, f"malformed message ({type(exc).__name__})")

        return on_task_received

    def _answer(self, message: Any, why: str) -> None:
        task_id = _task_id(message)
        log.error(
            "rejected message %s (content type %r): %s",
            writable(task_id or "<no id>"),
            getattr(message, "content_type", None),
            why,
        )
        if task_id is None or lone_surrogate(task_id):
            return  # no result can be stored under it
        result = failed_result(
            "",
            "",
            SkillErrorType.VALIDATION_ERROR,
            f"invalid message: {why}",
            {"content_type": getattr(message, "content_type", None)},
        )
        failure = SkillInvocationFailed(failure_summary(result), result_payload(result, task_id))
        try:
            if self.app.backend.get_task_meta(task_id).get("status") in ("SUCCESS", "FAILURE"):
                return  # a stored result is never overwritten by a later message
            self.app.backend.mark_as_failure(task_id, failure, store_result=True)
        except Exception as exc:  # the message is dropped either way; say why it has no result
            log.error("could not store the result of rejected message %s: %s", task_id, exc)

    def on_decode_error(self, message: Any, exc: Exception) -> None:
        """A body that does not decode (not JSON, compressed): answer it, ack it, never log it."""
        why = admission_problem(message, self.admitted_content_type) or (
            f"the body cannot be decoded ({type(exc).__name__})"
        )
        self._answer(message, why)
        message.ack()

    def on_invalid_task(self, body: Any, message: Any, exc: Exception) -> None:
        """A disallowed content type (pickle, ...) or a malformed envelope: answer, reject."""
        self._answer(
            message, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        )
        message.reject_log_error(log, self.connection_errors)  # type: ignore[attr-defined]
