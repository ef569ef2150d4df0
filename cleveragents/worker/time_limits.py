"""Celery's hard time limit on every task: the backstop behind the runtime's own deadline.

The runtime stops a tool at its timeout, but a python tool runs in the pool
process and can refuse to stop (it swallows every interruption, or blocks the
alarm signal and sleeps in C). So every task message gets a hard time limit
when the worker admits it (``cleveragents/worker/admission.py``): the invocation's timeout,
by the runtime's own rule (``timeout_of``, ``claims_write``), plus ``HARD_LIMIT_GRACE_S``.
Past it Celery ends the pool process (``SIGTERM``, then ``SIGKILL``) and starts
another; the tool costs one pool process, never the worker.

So each delivery's tool is looked up once in each process: here, in the main
process, as the message is admitted (the limit is set before a pool process
receives it; a chunk looks each of its tools up once), and in the pool process by
the runtime, which needs the resolved tool itself to run it (an object no message
carries). The limit is the timeout plus graces, so the runtime cannot read the
timeout back from it; it computes its own by the same rule. (A delivery the limit
ends is looked up here once more, to word its failure: ``hard_limit_result``.)

What the producer then finds:

* ``skills.invoke``: a ``tool_execution_failure`` with ``details["reason"] ==
  "timeout"``, stored under the request id by the worker's main process instead
  of Celery's bare ``TimeLimitExceeded`` (``HardLimitMixin``), and logged and
  counted in the metrics there; the message is acknowledged, so the tool does
  not run again.
* ``skills.invoke_chunk``: the chunk goes back to its queue (not acknowledged):
  redelivered, it stores each result as it goes and counts each invocation's
  deliveries, so the one that cannot be stopped ends as a poison message and the
  others run.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from celery import Celery

from cleveragents.constants import HARD_LIMIT_GRACE_S, TASK_INVOKE, TASK_INVOKE_CHUNK
from cleveragents.errors import SkillErrorType
from cleveragents.messages import SkillInvocationFailed, failure_summary, result_payload
from cleveragents.pipeline import chunk
from cleveragents.pipeline.guard import CLAIM_GRACE_S
from cleveragents.runtime.invoke import claims_write, timeout_of
from cleveragents.runtime.outcomes import (
    WRITE_UNKNOWN,
    failed_result,
    names_of,
    with_write_outcome,
)
from cleveragents.settings import Settings
from cleveragents.skills import Catalogue

__all__ = ["HardLimitMixin", "chunk_budget_s", "hard_limit_s", "install", "invocation_budget_s"]

log = logging.getLogger("cleveragents.worker")
#: Tools looked up so far: (skill, tool) -> (the tool's timeout, claims a write), None if unknown.
_Tools = dict[tuple[str, str], tuple[float | None, bool] | None]


def _request_timeout(body: dict[str, Any]) -> float | None:
    value = body.get("timeout_s")
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return None  # absent or invalid: the runtime refuses an invalid one before any tool runs


def invocation_timeout(
    body: Any, catalogue: Catalogue, settings: Settings, tools: _Tools | None = None
) -> tuple[float, bool]:
    """The invocation's timeout as the runtime will compute it, and whether it claims a write.

    An unknown skill or tool, or a body that is not a request, gets the default.
    ``tools`` remembers the tools already looked up (a chunk names a few, many times).
    """
    default_s, max_s = settings.default_timeout_s, settings.max_timeout_s
    found = _looked_up(body, catalogue, {} if tools is None else tools)
    if found is None:  # the runtime answers at once, without a tool
        return timeout_of(None, None, default_s, max_s), False
    tool_s, claims = found
    return timeout_of(tool_s, _request_timeout(body), default_s, max_s), claims


def _looked_up(body: Any, catalogue: Catalogue, tools: _Tools) -> tuple[float | None, bool] | None:
    """The main process's one lookup of a body's tool: its timeout and whether it claims
    a write; None if the body is not a request or the catalogue has no such tool."""
    if not isinstance(body, dict):
        return None
    names = names_of(body)
    if names not in tools:
        try:
            spec = catalogue.find_tool(*names)[1].tool
            tools[names] = (spec.timeout_s, claims_write(spec))
        except Exception:  # not in the catalogue
            tools[names] = None
    return tools[names]


def invocation_budget_s(
    body: Any, catalogue: Catalogue, settings: Settings, tools: _Tools | None = None
) -> float:
    """How long one invocation may take in its task, before the grace.

    Its timeout; a write that is not idempotent may first wait for an earlier
    delivery's claim, which lasts the timeout plus ``CLAIM_GRACE_S``.
    """
    timeout, claims = invocation_timeout(body, catalogue, settings, tools)
    return timeout + CLAIM_GRACE_S if claims else timeout


def chunk_budget_s(budgets: Sequence[float], stay_s: float, tail_s: float) -> float:
    """How long a chunk may run: its slices, then the longest invocation it may start.

    The chunk runs slices for at most ``stay_s`` in all, and starts no invocation
    later than ``tail_s`` past its last slice, after which one invocation may still
    run its whole budget (``cleveragents/pipeline/chunk.py``, ``_Clock.over``). So
    the limit does not grow with the chunk, nor with the requests looked up at once.
    """
    return stay_s + tail_s + max(budgets, default=0.0)


def _chunk_pacing() -> tuple[float, float]:
    # The chunk pipeline's own pacing (cleveragents/pipeline/chunk.py): a chunk runs
    # one slice, or slice after slice for up to STAY_S while nothing else waits.
    return float(max(chunk.SLICE_S, chunk.STAY_S)), float(chunk.TAIL_S)


def hard_limit_s(task: Any, args: Any, catalogue: Catalogue, settings: Settings) -> float:
    """The hard time limit of a task message of ``task`` with body ``args``."""
    args = args if isinstance(args, list | tuple) else []
    if task == TASK_INVOKE_CHUNK:
        bodies = args[0] if args and isinstance(args[0], list) else []
        bodies = bodies[: chunk.MAX_CHUNK_ITEMS]  # it sends the others back unrun
        stay_s, tail_s = _chunk_pacing()
        tools: _Tools = {}
        budgets = [invocation_budget_s(body, catalogue, settings, tools) for body in bodies]
        return chunk_budget_s(budgets, stay_s, tail_s) + HARD_LIMIT_GRACE_S
    body = args[0] if len(args) == 1 else None
    return invocation_budget_s(body, catalogue, settings) + HARD_LIMIT_GRACE_S


def hard_limit_result(body: Any, limit_s: float, catalogue: Catalogue, settings: Settings) -> Any:
    """The ``SkillResult`` of an invocation whose pool process the hard limit ended."""
    skill, tool = names_of(body)
    timeout, _ = invocation_timeout(body, catalogue, settings)
    result = failed_result(
        skill,
        tool,
        SkillErrorType.TOOL_EXECUTION_FAILURE,
        f"tool {tool!r} timed out after {timeout:g}s and did not stop: its worker process "
        f"was ended by the hard time limit ({limit_s:g}s)",
        {
            "reason": "timeout",
            "timeout_s": timeout,
            "hard_limit_s": limit_s,
            "exception_type": "TimeLimitExceeded",
        },
        duration_ms=limit_s * 1000,  # it ran until the limit ended it
    )
    try:
        writes = catalogue.find_tool(skill, tool)[1].tool.write_capable
    except Exception:  # not in the catalogue (then it never ran)
        writes = False
    return with_write_outcome(result, WRITE_UNKNOWN) if writes else result


class HardLimitMixin:
    """A Celery ``Request`` mixin: an invocation ended by the hard limit gets a ``SkillResult``.

    At a hard time-out Celery calls both ``on_failure`` (with ``TimeLimitExceeded``)
    and ``on_timeout``, and each would store a bare ``TimeLimitExceeded``. The
    first of them stores the invocation's failed ``SkillResult`` instead, and
    ``store_errors`` keeps Celery from storing over it. Everything else Celery
    does at a hard time-out (its log lines, ``task_failure``, the event, the
    acknowledgement) is unchanged.
    """

    _answered = False

    @property
    def store_errors(self) -> bool:
        """False once the ``SkillResult`` of a hard time-out is stored."""
        return False if self._answered else bool(super().store_errors)  # type: ignore[misc]

    def on_failure(self, exc_info: Any, *args: Any, **kwargs: Any) -> Any:
        """Celery's handler; a hard time-out first stores the invocation's failure."""
        exc: Any = getattr(exc_info, "exception", None)
        exc = getattr(exc, "exc", exc)  # billiard wraps it in ExceptionWithTraceback
        if type(exc).__name__ == "TimeLimitExceeded":
            limit = exc.args[0] if exc.args else None
            self._answer(float(limit) if isinstance(limit, int | float) else 0.0)
        return super().on_failure(exc_info, *args, **kwargs)  # type: ignore[misc]

    def on_timeout(self, soft: bool, timeout: float) -> None:
        """Celery's handler; a hard time-out first stores the invocation's failure."""
        if not soft:
            self._answer(timeout)
        super().on_timeout(soft, timeout)  # type: ignore[misc]

    def _answer(self, limit_s: float) -> None:
        request: Any = self
        if self._answered or request.task.name != TASK_INVOKE:
            return
        try:
            self._answered = _store_hard_limit_result(request, limit_s)
        except Exception as exc:  # Celery's own TimeLimitExceeded is stored instead
            log.error("could not store the time-out of %s: %s", request.id, exc)


def _store_hard_limit_result(request: Any, limit_s: float) -> bool:
    from cleveragents.worker import state  # the worker's catalogue, loaded before the pool started

    backend = request.task.backend
    if backend.get_task_meta(request.id).get("status") in ("SUCCESS", "FAILURE"):
        return False  # stored just before the limit: that result stands
    current = state.current()
    args = request.args if isinstance(request.args, list | tuple) else []
    body = args[0] if len(args) == 1 else None
    result = hard_limit_result(body, limit_s, current.catalogue, current.settings)
    payload = result_payload(result, request.id)
    failure = SkillInvocationFailed(failure_summary(result), payload)
    backend.mark_as_failure(request.id, failure, request=request._context, store_result=True)
    # Its pool process died before it could log or count the invocation: this process
    # does both (its counts are flushed with this process's, at its exit at the latest).
    state.pipeline(backend).observe(request.id, result)
    return True


def install(app: Celery) -> None:
    """Give our tasks the hard-limit behaviour (at worker start, before any message).

    Each task's ``Request`` class gets ``HardLimitMixin``; a chunk ended by the
    hard limit is given back to its queue rather than acknowledged.
    """
    for name in (TASK_INVOKE, TASK_INVOKE_CHUNK):
        task = app.tasks.get(name)
        if task is None:
            continue
        base = task.Request
        if isinstance(base, str):
            from celery.utils.imports import symbol_by_name

            base = symbol_by_name(base)
        if not issubclass(base, HardLimitMixin):
            limited = type(f"HardLimited{base.__name__}", (HardLimitMixin, base), {})
            setattr(task, "Request", limited)  # noqa: B010  (typed as a str by celery-types)
    chunk = app.tasks.get(TASK_INVOKE_CHUNK)
    if chunk is not None:
        setattr(chunk, "acks_on_timeout", False)  # noqa: B010  (Celery 5.5+, untyped)
