"""Task events for a chunk's failed invocations: each is its own failed row in Flower.

Flower builds its tasks table from task events. A chunk is one task, so its
invocations would be visible only as the chunk's counts. For every invocation of
a chunk that failed, the pool process sends the events a failed ``skills.invoke``
sends (``task-received``, ``task-started``, ``task-failed``) under the
invocation's request id, from the worker's hostname: Flower lists it with the
invocation's skill, tool, batch and item number, and its ``error_type: message``.
Successes stay counted in their chunk's row: a row each would be three million
events for a million-line batch, and Flower keeps its rows in memory (``--max_tasks``).

The events follow the worker's own switch: they are sent only when the worker
sends task events at the time it receives the chunk (``task_events_on``; the
consumer's request records it for the pool process, ``EVENTS_FIELD``). Argument
values never leave the worker: the rows show what ``redacted_repr`` shows, and
the message with every argument string blanked out.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from celery import Task
from celery.events.state import HEARTBEAT_DRIFT_MAX  # type: ignore[attr-defined]

from cleveragents.constants import TASK_INVOKE
from cleveragents.messages import ChunkContext, SkillInvocationFailed, failure_summary, item_repr
from cleveragents.pipeline import ItemFailure

__all__ = ["EVENTS_FIELD", "ItemEvents", "task_events_on", "tell_flower_later"]

log = logging.getLogger("cleveragents.worker")

#: Request field the consumer sets (overwriting any header of that name): whether the
#: worker sent task events when it received the chunk.
EVENTS_FIELD = "cleveragents_task_events"
#: Events buffered before one publish (three per failed invocation).
_EVENTS_PER_PUBLISH = 300
#: Event times older than this are sent as the time of sending: Flower (Celery's
#: ``State``) warns of unsynchronised clocks for an event older than ``HEARTBEAT_DRIFT_MAX``.
_OLDEST_S = HEARTBEAT_DRIFT_MAX - 1


def task_events_on(eventer: Any) -> bool:
    """Whether a worker's event dispatcher sends task events now (Celery's own rule).

    Enabled, and the ``task`` group not left out: ``celery control disable_events``
    leaves it out, ``enable_events`` (Flower sends it every few seconds) puts it back.
    """
    if eventer is None or not eventer.enabled:
        return False
    groups = eventer.groups
    return not groups or "task" in groups


#: How long after a delivery its own state event is sent: after the worker's buffered
#: events of the delivery (``worker/consumer.py``, 50 ms), so that it is the last.
LATE_EVENT_S = 0.25


def tell_flower_later(task: Task[Any, Any], event_type: str, **fields: Any) -> None:
    """Send a task event about this delivery once the worker's own have gone out.

    A custom ``event_type`` (``task-awaiting_approval``) is a state of its own in
    Flower (Celery's ``State`` upper-cases it). Nothing is sent when the worker sent
    no task events as it received the message; a failure to send is one warning.
    """
    request = task.request
    if getattr(request, EVENTS_FIELD, None) is not True:
        return
    told = (task.app, request.hostname, request.id, event_type, fields)
    timer = threading.Timer(LATE_EVENT_S, _send_event, told)
    timer.daemon = True
    timer.start()


def _send_event(app: Any, hostname: str, uuid: str, event_type: str, fields: Any) -> None:
    try:
        with app.events.default_dispatcher(hostname=hostname) as dispatcher:
            dispatcher.send(event_type, uuid=uuid, **fields)
    except Exception as exc:  # only Flower's row is late
        log.warning("could not tell Flower of %s (%s): %s", uuid, event_type, exc)


def _arguments(body: Any) -> Any:
    return body.get("arguments") if isinstance(body, dict) else None


class ItemEvents:
    """Sends a chunk's failed invocations to Flower, as failed ``skills.invoke`` tasks.

    Called by the pipeline with the failures of a slice once their results are
    stored; counts them for the chunk's own row. Sending never fails the chunk: the
    results are stored already, so a broker error is logged and the rows are lost.
    """

    def __init__(self, task: Task[Any, Any], context: ChunkContext | None) -> None:
        self.task = task
        self.context = context
        self.failed = 0

    def enabled(self) -> bool:
        """Whether the worker sent task events when it received this chunk."""
        return getattr(self.task.request, EVENTS_FIELD, None) is True

    def __call__(self, failures: list[ItemFailure]) -> None:
        """Send the events of ``failures`` in as few publishes as the buffer allows."""
        self.failed += len(failures)
        if not failures or not self.enabled():
            return
        try:
            self._send(failures)
        except Exception as exc:  # the results are stored: only the rows are lost
            log.warning(
                "could not send the task events of %d failed invocations: %s", len(failures), exc
            )

    def _send(self, failures: list[ItemFailure]) -> None:
        app, request = self.task.app, self.task.request
        chunk_id = request.id or None
        with app.amqp.producer_pool.acquire(block=True) as producer:
            dispatcher = app.events.Dispatcher(
                producer.connection,
                hostname=request.hostname,
                channel=producer.channel,
                buffer_group=["task"],
                buffer_limit=_EVENTS_PER_PUBLISH,
            )
            with dispatcher:
                for failure in failures:
                    self._events(dispatcher, failure, chunk_id, request.root_id or chunk_id)
                dispatcher.flush()

    def _events(self, dispatcher: Any, failure: ItemFailure, chunk_id: Any, root_id: Any) -> None:
        uuid = failure.request_id
        summary = failure_summary(failure.result, _arguments(failure.body))
        # When it started and ended, unless that is so long ago (a tool that ran into a
        # long time-out) that Flower would take it for a clock out of sync: then the
        # time of sending, and the runtime column says how long it ran.
        now = time.time()
        started, ended = failure.started, min(failure.started + failure.runtime_s, now)
        if now - started >= _OLDEST_S:
            started = ended = now
        dispatcher.send(
            "task-received",
            uuid=uuid,
            name=TASK_INVOKE,  # the task that runs it alone: Flower lists it with them
            args=item_repr(failure.body, self.context, failure.index),
            kwargs="{}",
            retries=0,
            eta=None,
            expires=None,
            root_id=root_id,
            parent_id=chunk_id,  # the chunk's task page lists it among its children
            timestamp=started,
        )
        dispatcher.send("task-started", uuid=uuid, timestamp=started)
        dispatcher.send(
            "task-failed",
            uuid=uuid,
            exception=repr(SkillInvocationFailed(summary)),
            traceback=None,
            runtime=failure.runtime_s,
            timestamp=ended,
        )
