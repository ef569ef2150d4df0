"""An invocation sent back to the broker with a delay: a retry, or a wait for a limit.

Neither holds a pool process nor a prefetch slot while it waits: the message goes
back under the same request id, to the queue it came from, with an ETA (Celery's
``countdown``), and the process takes the next one. A worker that takes it keeps it
as Celery keeps any message with an ETA (out of its prefetch count) and on Redis
holds it under its heartbeat, so that a worker killed during the delay loses
nothing: the message is given back and runs elsewhere.

The message carries the trace context of the one it replaces, so that every attempt
and every wait stays in the trace the call was sent in. Two headers say what the
message is: Celery's own ``retries`` (the attempts that
ran before this one) and ``cleveragents_waits`` (how many times it was sent back
to wait for a limit). The worker's admission keeps an ETA only on such a message,
for a tool whose policy allows that long a wait (``worker/admission.py``).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import Task

from cleveragents.constants import FIRST_RUN_POLL_S, MAX_LIMIT_WAIT_S
from cleveragents.messages import redacted_repr
from cleveragents.runtime.invoke import claims_write
from cleveragents.skills.model import ToolSpec
from cleveragents.tasks.events import EVENTS_FIELD
from cleveragents.traces.carriers import TRACE_HEADERS, carrier_of

__all__ = [
    "MAX_LIMIT_WAIT_S",
    "WAITS_HEADER",
    "attempt_of",
    "eta_allowed_s",
    "resend",
    "resent_key",
    "waits_of",
]

log = logging.getLogger("cleveragents.worker")

#: Header counting how many times a message was sent back to wait for a limit.
WAITS_HEADER = "cleveragents_waits"
#: How long after sending a message back Flower is told that it waits: after the
#: worker's buffered events of the delivery (``worker/consumer.py``, 50 ms).
EVENT_AFTER_S = 0.25
#: Most attempts a ``retries`` header may claim to have run.
_MOST_RETRIES = 100


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        return 0
    return max(0, min(value, _MOST_RETRIES))


def attempt_of(task: Task[Any, Any]) -> int:
    """Which attempt of its invocation this delivery runs (1: the first)."""
    return _count(task.request.retries) + 1


def waits_of(task: Task[Any, Any]) -> int:
    """How many times this invocation was sent back to wait for a limit."""
    return _count((task.request.headers or {}).get(WAITS_HEADER))


def resent_key(task: Task[Any, Any]) -> str:
    """What tells this message from the others sent under its request id ("" for the
    first): a store that counts every delivery counts each message on its own."""
    retries, waits = attempt_of(task) - 1, waits_of(task)
    return f"r{retries}w{waits}" if retries or waits else ""


def resend(task: Task[Any, Any], delay_s: float, *, retry: bool, why: str = "") -> None:
    """Send this task's message back with ``delay_s`` of delay: the next attempt
    (``retry``) or the same one, after a wait for a limit.

    Flower is told with a ``task-retried`` event saying ``why``: it then shows the
    invocation as retried and, once the message is back, as received with its ETA,
    not as running (the pool process had started it).
    """
    request = task.request
    delivery = request.delivery_info or {}
    queue = delivery.get("routing_key") or None
    retries = attempt_of(task) - 1 + (1 if retry else 0)
    waits = waits_of(task) + (0 if retry else 1)
    options: dict[str, Any] = {
        "task_id": request.id,
        "countdown": max(0.0, delay_s),
        "retries": retries,  # Celery's own header: the attempts before this one
        # and the trace it was sent in: every attempt and every wait stays in it
        "headers": {WAITS_HEADER: waits, **_trace_of(request)},
        # Flower shows what the message says: the arguments' names, never their values
        "argsrepr": _shown(request.args),
        "kwargsrepr": "{}",
    }
    if queue:
        options["queue"] = queue
    task.apply_async(tuple(request.args or ()), dict(request.kwargs or {}), **options)
    if why and getattr(request, EVENTS_FIELD, None) is True:
        # Sent once the worker's own buffered events of this delivery (its start, and
        # the message coming back with its ETA) have gone out: Celery's event state
        # keeps the last of them, which is then this one.
        told = (task.app, request.hostname, request.id, why)
        timer = threading.Timer(EVENT_AFTER_S, _say_waiting, told)
        timer.daemon = True
        timer.start()


def _trace_of(request: Any) -> dict[str, str]:
    """The trace context the message carried (``traceparent``, ``tracestate``), checked."""
    return carrier_of({name: getattr(request, name, None) for name in TRACE_HEADERS})


def _say_waiting(app: Any, hostname: str, task_id: str, why: str) -> None:
    try:
        with app.events.default_dispatcher(hostname=hostname) as dispatcher:
            dispatcher.send("task-retried", uuid=task_id, exception=why, traceback=None)
    except Exception as exc:  # the message went back: only Flower's row is late
        log.warning("could not tell Flower that %s waits: %s", task_id, exc)


def _shown(args: Any) -> str:
    body = args[0] if isinstance(args, list | tuple) and len(args) == 1 else None
    return redacted_repr(body) if isinstance(body, dict) else "[redacted]"


def eta_allowed_s(tool: ToolSpec | None, skill_limited: bool, headers: dict[str, Any]) -> float:
    """The longest delay a message with ``headers`` may carry for ``tool``: 0 unless it
    was sent back as a retry of a tool with a ``retry`` policy, to wait for a limit of
    a limited tool (``skill_limited``: its skill has limits), or to wait for the first
    run of a write that takes a claim (``pipeline/guard.py``)."""
    if tool is None:
        return 0.0
    longest = 0.0
    if _count(headers.get("retries")) and tool.retry is not None:
        longest = tool.retry.longest_delay_s
    if _count(headers.get(WAITS_HEADER)) and (tool.limits or skill_limited):
        longest = max(longest, MAX_LIMIT_WAIT_S)
    if _count(headers.get(WAITS_HEADER)) and claims_write(tool):
        longest = max(longest, FIRST_RUN_POLL_S)
    return longest
