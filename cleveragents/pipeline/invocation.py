"""The pipeline: one delivered invocation through its policies, the guard and the runtime.

``Pipeline.deliver`` decides what becomes of a delivery (``pipeline/delivery.py``);
``execute`` runs one where nothing can send it back (tests, in-process use).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

from cleveragents.approvals.gate import ApprovalGate
from cleveragents.approvals.model import AwaitingApproval
from cleveragents.pipeline.audit_trail import WriteTrail
from cleveragents.pipeline.binding import (
    REASON_CANCELLED,
    REASON_REUSED,
    cancelled_result,
    content_digest,
    reused_result,
)
from cleveragents.pipeline.delivery import (
    ANSWERED,
    DROPPED,
    PARKED,
    RAN,
    RETRY,
    WAIT,
    Delivery,
    Outcome,
)
from cleveragents.pipeline.guard import FIRST_RUN_POLL_S, FirstRunGoesOn, Guard
from cleveragents.pipeline.quotas import take_limits
from cleveragents.pipeline.retries import retried, retry_delay_s, with_attempts
from cleveragents.runtime import DEFAULT_TIMEOUT_S
from cleveragents.runtime import invoke as run_invocation
from cleveragents.runtime.invoke import MAX_TIMEOUT_S, BeforeWrite, RunHooks
from cleveragents.runtime.request import SkillInvocationRequest
from cleveragents.skills import Catalogue, SkillResult, ToolSpec
from cleveragents.skills.catalogue import ToolPolicies
from cleveragents.stores import ResultStore, StartedMark, Stores
from cleveragents.stores.audit import AuditLog
from cleveragents.stores.quotas import LimitGate, Permit

__all__ = ["Delivered", "DeliveryNotRun", "Observer", "Pipeline", "execute"]

#: Told of every finished invocation (a worker logs its line and counts it).
Observer = Callable[[str, SkillResult], None]
#: A batch line's span (``Pipeline.line_span``).
LineSpan = Callable[
    [Any, str], AbstractContextManager[Callable[[SkillResult | None, str | None], None]]
]


def _unobserved(request_id: str, result: SkillResult) -> None:
    """The default observer: nothing is reported."""


def _no_wait(skill: str, tool: str, seconds: float) -> None:
    """The default of ``Pipeline.on_wait``: nothing is counted."""


@dataclass(frozen=True)
class Pipeline:
    """What every invocation in a worker process needs: catalogue, policy, guard and stores."""

    catalogue: Catalogue
    guard: Guard
    results: ResultStore
    read_only: bool = False
    default_timeout_s: float = DEFAULT_TIMEOUT_S
    max_timeout_s: float = MAX_TIMEOUT_S
    observe: Observer = field(default=_unobserved)
    #: Where fleet-wide limits are taken (None: no limit is kept).
    limit_gate: LimitGate | None = None
    #: Told of each invocation sent back to wait for a limit: skill, tool, seconds.
    on_wait: Callable[[str, str, float], None] = field(default=_no_wait)
    #: Where tools that need a person's approval wait for it (None: none waits).
    approvals: ApprovalGate | None = None
    #: Where write-capable invocations leave their audit events (None: nowhere).
    audit: AuditLog | None = None
    #: The span of one batch line (body, request id), where the worker traces: it yields
    #: the function that records the line's result (or what happened instead).
    line_span: LineSpan | None = None

    @classmethod
    def over(
        cls,
        catalogue: Catalogue,
        stores: Stores,
        *,
        read_only: bool = False,
        default_timeout_s: float = DEFAULT_TIMEOUT_S,
        max_timeout_s: float = MAX_TIMEOUT_S,
        observe: Observer = _unobserved,
        limit_gate: LimitGate | None = None,
        on_wait: Callable[[str, str, float], None] = _no_wait,
        approvals: ApprovalGate | None = None,
        line_span: LineSpan | None = None,
    ) -> Pipeline:
        """A pipeline whose guard, results and audit log live in ``stores``."""
        return cls(
            catalogue,
            Guard(stores.guard),
            stores.results,
            read_only=read_only,
            default_timeout_s=default_timeout_s,
            max_timeout_s=max_timeout_s,
            observe=observe,
            limit_gate=limit_gate,
            on_wait=on_wait,
            approvals=approvals,
            audit=stores.audit,
            line_span=line_span,
        )

    def policy_tool(self, body: Any) -> ToolPolicies | None:
        """The policies of the catalogue tool ``body`` asks for (None: there is no such
        tool; the run says why)."""
        if not isinstance(body, dict):
            return None
        return self.catalogue.policies(body.get("skill"), body.get("tool"))

    def take_limits(self, found: ToolPolicies) -> float | list[Permit]:
        """Places under the tool's limits and its skill's: permits, or the seconds to
        wait before asking again (nothing held)."""
        if self.limit_gate is None:
            return []
        return take_limits(self.limit_gate, found, self.on_wait)

    def run(
        self,
        body: Any,
        before_write: BeforeWrite | None = None,
        *,
        request_id: str = "",
        first: bool = True,
        asked_by: str | None = None,
        trace: Mapping[str, str] | None = None,
        found: ToolPolicies | Exception | None = None,
    ) -> SkillResult:
        """Run one decoded request body through the runtime with this process's policy.

        With a ``request_id`` (a delivery under the guard), a tool that needs approval
        is parked (``AwaitingApproval`` is raised) and a write-capable one leaves its
        audit events (``first``: the invocation's first delivery; ``asked_by``: who
        sent it, where known; ``trace``: the trace context its message carried, kept
        with a parked invocation for the run a decision sends on).
        """
        trails: list[WriteTrail] = []  # the delivery's audit trail, once its tool is known
        hooks = RunHooks(
            on_found=partial(self._open_trail, trails, body, request_id, first)
            if request_id and self.audit is not None
            else None,
            before_start=self._approval_hook(body, request_id, trails, asked_by, trace),
            on_start=lambda *_: trails[0].on_start() if trails else None,
        )
        try:
            result = run_invocation(
                body,
                self.catalogue,
                read_only=self.read_only,
                default_timeout_s=self.default_timeout_s,
                max_timeout_s=self.max_timeout_s,
                before_write=before_write,
                hooks=hooks,
                found=found.found if isinstance(found, ToolPolicies) else found,
            )
        except AwaitingApproval:
            if trails:
                trails[0].flush()
            raise
        if trails:
            trails[0].ended(result)
        return result

    def _open_trail(
        self,
        trails: list[WriteTrail],
        body: Any,
        request_id: str,
        first: bool,
        request: SkillInvocationRequest,
        tool: ToolSpec,
    ) -> None:
        """Open the delivery's audit trail when its tool is a write or needs approval."""
        gated = self.approvals is not None and self.approvals.needs(tool)
        if self.audit is None or not (tool.write_capable or gated):
            return
        digest = content_digest(body)
        trail = WriteTrail(self.audit, request_id, request.skill, tool.name, digest, first=first)
        trails.append(trail)

    def _approval_hook(
        self,
        body: Any,
        request_id: str,
        trails: list[WriteTrail],
        asked_by: str | None,
        trace: Mapping[str, str] | None,
    ) -> Callable[[SkillInvocationRequest, ToolSpec], None] | None:
        gate = self.approvals
        if gate is None or not request_id or not isinstance(body, dict):
            return None

        def before_start(request: SkillInvocationRequest, tool: ToolSpec) -> None:
            if not gate.needs(tool):
                return
            digest = content_digest(body)
            resolution = gate.resolve(request_id, body, tool, digest, asked_by, trace)
            if trails:
                trails[0].approval(resolution)
            gate.enforce(resolution)

        return before_start

    def answered(
        self, body: Any, request_id: str, started: StartedMark | None = None
    ) -> SkillResult | None:
        """The answer to a delivery that must not run, if it is one.

        Its id bound to other content: the ``request_id_reused`` refusal. Its id bound
        to this content with a result stored that answers it: that result. Both store
        nothing. Its id cancelled before any run of it started: the ``cancelled``
        failure, which is stored as its result. Where the delivery runs, ``started``
        (if given) is stored first. The first delivery of an id costs one round trip
        on Redis, its ``STARTED`` and its cancel mark included.
        """
        digest = content_digest(body)
        if started is None:
            [before] = self.guard.store.bind([(request_id, digest)])
            marked = False
        else:
            before, marked, cancelled = self.guard.store.bind_starting(request_id, digest, started)
            if cancelled:
                return cancelled_result(body, request_id)
        if before is None:
            return None
        if before != digest:
            return reused_result(body)
        if marked:  # no finished result is stored: it runs
            return None
        writes = isinstance(body, dict) and body.get("allow_writes") is True
        [stored] = self.results.reusable([request_id], [writes])
        if stored is not None:
            return SkillResult.model_validate(stored)
        if started is not None:
            started.write()
        return None

    def deliver(self, delivery: Delivery) -> Outcome:
        """What becomes of one delivery, decided once (``pipeline/delivery.py``): limits
        taken, the answer that needs no run, the guarded run, permits given back, the
        retry decided, the outcome observed."""
        body, request_id = delivery.body, delivery.request_id
        looked = self.catalogue.lookup(*_names(body))
        found = looked if isinstance(looked, ToolPolicies) else None
        permits: list[Permit] = []
        if found is not None and found.limited and delivery.may_send_back:
            taken = self.take_limits(found)
            if isinstance(taken, float):
                return Outcome(WAIT, delay_s=taken, found=found)
            permits = taken
        try:
            if not delivery.chunk_item:
                answer = self.answered(body, request_id, delivery.started)
                if answer is not None:
                    return self._answer(request_id, answer, found)
            delivered = self.run_delivery(
                body,
                request_id,
                redelivered=delivery.redelivered,
                chunk_item=delivery.chunk_item,
                resent=delivery.resent,
                asked_by=delivery.asked_by,
                trace=delivery.trace,
                found=looked,
                may_send_back=delivery.may_send_back,
            )
        except AwaitingApproval as parked:  # no process waits: a decision sends it again
            return Outcome(PARKED, resolution=parked.resolution, found=found)
        except FirstRunGoesOn:  # no process waits for another machine's run
            return Outcome(WAIT, delay_s=FIRST_RUN_POLL_S, found=found, first_run=True)
        finally:
            for permit in permits:
                permit.release()
        return self._ran(delivery, delivered, found)

    def _answer(self, request_id: str, answer: SkillResult, found: ToolPolicies | None) -> Outcome:
        """A delivery answered without a run: cancelled (its answer is stored), its id bound
        to other content (observed, never stored), or finished already (nothing to do)."""
        reason = answer.error.details.get("reason") if answer.error is not None else None
        if reason == REASON_CANCELLED:
            self.observe(request_id, answer)
            return Outcome(ANSWERED, answer, found=found)
        if reason == REASON_REUSED:
            self.observe(request_id, answer)
        return Outcome(ANSWERED, answer, stored=True, found=found)

    def _ran(self, delivery: Delivery, delivered: Delivered, found: ToolPolicies | None) -> Outcome:
        """The outcome of a run: dropped, retried later, or its result (observed)."""
        result, attempt = delivered.result, delivery.attempt
        check = delivery.finished_elsewhere
        if check is not None and check(result):
            return Outcome(DROPPED, result, found=found)
        tool = found.tool if found is not None else None
        if tool is not None and tool.retry is not None and delivery.may_send_back:
            delay = retry_delay_s(tool, result, attempt)
            if delay is not None:  # back to the broker: no process waits for it
                self.observe(delivery.request_id, retried(result, attempt))
                return Outcome(RETRY, result, delay_s=delay, found=found)
        if not _cancelled(result):
            result = with_attempts(result, attempt)
        if not delivered.elsewhere:
            self.observe(delivery.request_id, result)
        return Outcome(RAN, result, elsewhere=delivered.elsewhere, found=found)

    def run_delivery(
        self,
        body: Any,
        request_id: str,
        *,
        redelivered: bool,
        chunk_item: bool = False,
        resent: str = "",
        asked_by: str | None = None,
        trace: Mapping[str, str] | None = None,
        found: ToolPolicies | Exception | None = None,
        may_send_back: bool = False,
    ) -> Delivered:
        """Run one delivery under the guard: counted, its write claimed, perhaps not run at
        all; and whether the result is another run's (a write that run finished, which
        that run counted and logged). ``deliver`` is what carriers call.

        Raises:
            AwaitingApproval: its tool needs a person's approval; it is parked.
            FirstRunGoesOn: with ``may_send_back``, its write's first run may still go on.
        """
        with self.guard.delivery(
            request_id, body, redelivered=redelivered, chunk_item=chunk_item, resent=resent,
            may_send_back=may_send_back,
        ) as delivery:  # fmt: skip
            if delivery.settled is not None:
                return Delivered(delivery.settled, delivery.elsewhere)
            first = not (redelivered or resent)
            ran = self.run(
                body,
                delivery.claim,
                request_id=request_id,
                first=first,
                asked_by=asked_by,
                trace=trace,
                found=found,
            )
            result = delivery.finish(ran)
            return Delivered(result, delivery.elsewhere)


class Delivered(NamedTuple):
    """A delivery's result, and whether it is another run's (already reported by it)."""

    result: SkillResult
    elsewhere: bool


def execute(pipeline: Pipeline, body: Any, *, request_id: str, redelivered: bool) -> SkillResult:
    """Run one delivered invocation; every outcome is a ``SkillResult``.

    ``request_id`` is the message's task id: the guard counts and claims under it.
    A message without one (not our producer's) runs unguarded: there is no id to
    store its result under anyway. The path a worker's task runs (``deliver``), with
    no carrier to send it back: a delivery that would wait for its tool's limits or
    retry raises ``DeliveryNotRun``, one that parks ``AwaitingApproval``; one that
    waits for its write's first run asks again after the delay, in this process.
    """
    if not request_id:
        result = pipeline.run(body)
        pipeline.observe(request_id, result)
        return result
    outcome = pipeline.deliver(Delivery(body, request_id, redelivered=redelivered))
    waits = 0
    while outcome.kind == WAIT and outcome.first_run:
        waits += 1
        time.sleep(outcome.delay_s)  # as the broker would hold it for a carrier
        resent = Delivery(body, request_id, redelivered=False, resent=f"first-run-{waits}")
        outcome = pipeline.deliver(resent)
    if outcome.kind == PARKED and outcome.resolution is not None:
        raise AwaitingApproval(outcome.resolution)
    if outcome.result is None or outcome.kind in (WAIT, RETRY):
        raise DeliveryNotRun(outcome)
    return outcome.result


class DeliveryNotRun(Exception):
    """Raised by ``execute`` for a delivery that must be sent back or waits for a person."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(f"delivery not run: {outcome.kind}")
        self.outcome = outcome


def _names(body: Any) -> tuple[Any, Any]:
    return (body.get("skill"), body.get("tool")) if isinstance(body, dict) else (None, None)


def _cancelled(result: SkillResult) -> bool:
    return result.error is not None and result.error.details.get("reason") == REASON_CANCELLED
