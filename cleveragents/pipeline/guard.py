"""At-most-once for writes, and an end to poison messages.

Celery with ``acks_late`` redelivers a message whose worker died, and Redis
redelivers one whose tool outlives the visibility timeout. Both are right for
reads and wrong for a write that may already have happened. The guard keeps two
small records per request id in its ``GuardStore`` (``cleveragents.stores``):

* an **attempt counter**, incremented at every counted delivery: past
  ``MAX_ATTEMPTS`` the invocation is finished with a failure instead of run,
  so a message that kills its worker every time ends;
* a **write claim**, taken atomically just before a write-capable,
  non-idempotent tool starts: a second delivery that finds it does not run the
  tool. It waits for the first run's result while that run may still be going
  (its owner is alive and within its deadline), and otherwise reports that the
  write may or may not have happened. Where its carrier can send it back, it does
  not wait in the process (``FirstRunGoesOn``): a host left with the caught writes
  of a lost or cut-off one would otherwise serve nothing new until they end.

One delivery is one ``Delivery``, a context around the run::

    with guard.delivery(request_id, body, redelivered=flag) as d:
        result = d.settled or d.finish(invoke(body, catalogue, before_write=d.claim))
"""

from __future__ import annotations

import time
from types import TracebackType
from typing import Any

from cleveragents.constants import FIRST_RUN_POLL_S
from cleveragents.errors import SkillErrorType, ToolExecutionError
from cleveragents.messages import result_payload
from cleveragents.runtime.outcomes import (
    WRITE_UNKNOWN,
    failed_result,
    names_of,
    with_write_outcome,
)
from cleveragents.runtime.request import SkillInvocationRequest
from cleveragents.skills import SkillResult, ToolSpec
from cleveragents.stores import Claim, GuardStore

__all__ = [
    "CLAIM_GRACE_S",
    "FIRST_RUN_POLL_S",
    "MAX_ATTEMPTS",
    "Claim",
    "Delivery",
    "FirstRunGoesOn",
    "Guard",
    "WriteAlreadyClaimed",
    "interrupted_result",
    "poison_result",
]

#: Deliveries of one invocation before it is finished as a poison message.
MAX_ATTEMPTS = 3
#: Seconds a claim outlives its deadline, so a late result is still waited for.
CLAIM_GRACE_S = 30.0


class WriteAlreadyClaimed(ToolExecutionError):
    """Raised instead of starting a write whose request id another run has claimed."""

    def __init__(self, claim: Claim) -> None:
        super().__init__(
            "this write was already started by an earlier delivery of the same request",
            details={"reason": "write_already_started"},
        )
        self.claim = claim


class FirstRunGoesOn(Exception):
    """Raised instead of waiting in the process for a write's first run that may still
    go on: the delivery goes back to the broker and asks again in ``FIRST_RUN_POLL_S``."""


def poison_result(body: Any, attempts: int) -> SkillResult:
    """The failure that ends an invocation delivered too many times."""
    skill, tool = names_of(body)
    return failed_result(
        skill,
        tool,
        SkillErrorType.TOOL_EXECUTION_FAILURE,
        f"gave up after {attempts - 1} deliveries: the invocation ended its worker "
        "process every time (a poison message)",
        {"reason": "poison_message", "attempts": attempts - 1},
    )


def interrupted_result(body: Any) -> SkillResult:
    """The failure of a write whose first run was interrupted before it reported back."""
    skill, tool = names_of(body)
    interrupted = failed_result(
        skill,
        tool,
        SkillErrorType.TOOL_EXECUTION_FAILURE,
        "an earlier delivery of this request started the write and was interrupted "
        "before it reported back, so it was not run again",
        {"reason": "write_interrupted"},
    )
    return with_write_outcome(interrupted, WRITE_UNKNOWN)


class Guard:
    """The at-most-once policy over a ``GuardStore`` (see the module docstring)."""

    def __init__(self, store: GuardStore, *, poll_s: float = 0.2) -> None:
        if store is None:
            raise TypeError("a Guard needs a GuardStore: without one nothing is at most once")
        self.store = store
        self.poll_s = poll_s

    def delivery(
        self,
        request_id: str,
        body: Any,
        *,
        redelivered: bool,
        chunk_item: bool = False,
        resent: str = "",
        may_send_back: bool = False,
    ) -> Delivery:
        """One delivery of ``request_id``; use it as a context around the run.

        A message sent back under the id (``resent``: a retry, a wait) is counted on its
        own where every delivery is counted: a retry is not a redelivery. With
        ``may_send_back`` a wait for a write's first run raises ``FirstRunGoesOn``.
        """
        delivery = Delivery(
            self, request_id, body, redelivered=redelivered, chunk_item=chunk_item,
            resent=resent, may_send_back=may_send_back,
        )  # fmt: skip
        if resent:
            delivery.count_as = f"{request_id}#{resent}"
        return delivery

    def chunk_redelivered(self, chunk_id: str, redelivered: bool) -> bool:
        """Whether a chunk is run with care: it came back (its worker process died running
        it), or it is the rest of one that did (``care_for_rest``).

        A broker that marks redeliveries says so; on one that does not, the chunk counts
        its own deliveries. One round trip per chunk message.
        """
        if not chunk_id:
            return redelivered
        return self.store.attempt(f"chunk:{chunk_id}") > 1 or (
            redelivered and self.store.marks_redeliveries
        )

    def care_for_rest(self, chunk_id: str) -> None:
        """The chunk message ``chunk_id``, about to be sent with the rest of a chunk run
        with care, is run with care too: its first delivery counts as its second.

        Without it the rest of a chunk that came back would be a new message, whose
        invocations are not counted: one that kills its process would run again
        uncounted, beyond the poison limit.
        """
        self.store.attempt(f"chunk:{chunk_id}")

    def counts(self, *, redelivered: bool, chunk_item: bool) -> bool:
        """Whether a delivery is counted towards ``MAX_ATTEMPTS``.

        Where the broker marks redeliveries, only they are counted (a first delivery
        costs no round trip); elsewhere every interactive delivery is, and a batch
        item only once its chunk came back.
        """
        return redelivered or (not self.store.marks_redeliveries and not chunk_item)

    def deliveries(self, request_id: str) -> int:
        """Count this delivery; return how many there have been, the uncounted first included."""
        first = 1 if self.store.marks_redeliveries else 0
        return self.store.attempt(request_id) + first

    def await_first_run(
        self, request_id: str, body: Any, claim: Claim | None
    ) -> tuple[SkillResult, bool]:
        """The result of a write claimed by another run: wait for it while that run may go
        on. True with it when it is that run's own result (counted and logged by that
        run, not again here); False when that run was lost (``write_interrupted``)."""
        while claim is not None and claim.running():
            time.sleep(self.poll_s)
            claim = self.store.read_claim(request_id)
        if claim is not None and claim.done is not None:
            return SkillResult.model_validate(claim.done), True
        return interrupted_result(body), False


class Delivery:
    """One delivery of one invocation: counted, and its write claimed, under the guard.

    Entering it counts the delivery and may settle it without a run (``settled``):
    a poison message ends, and a delivery that finds a live first run of its write
    waits for that run's result. ``claim`` is the runtime's ``before_write`` hook;
    ``finish`` takes the run's result and returns the delivery's.
    """

    def __init__(
        self,
        guard: Guard,
        request_id: str,
        body: Any,
        *,
        redelivered: bool,
        chunk_item: bool,
        resent: str = "",
        may_send_back: bool = False,
    ) -> None:
        self.guard = guard
        self.request_id = request_id
        #: Sent back under its id before (a retry, a wait): it looks for a running claim.
        self.resent = resent
        #: Its carrier can send it back: a wait for the first run raises ``FirstRunGoesOn``.
        self.may_send_back = may_send_back
        #: What its deliveries are counted under (its id; a resent message: its own).
        self.count_as = request_id
        self.body = body
        self.redelivered = redelivered
        self.chunk_item = chunk_item
        #: The delivery's result when it must not run (poison, or another run's write).
        self.settled: SkillResult | None = None
        #: Its result is another run's (a write that run finished): that run reported it.
        self.elsewhere = False
        self._owns_claim = False
        self._held: Claim | None = None

    def __enter__(self) -> Delivery:
        self.settled = self._admit()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        # Nothing to undo: a claim taken by a run that raised stays, and a later
        # delivery reports that write as interrupted once this process is gone.
        return None

    def _admit(self) -> SkillResult | None:
        guard, request_id = self.guard, self.request_id
        claim = guard.store.read_claim(request_id) if self.redelivered or self.resent else None
        if claim is not None and claim.running():
            # Handed out again while its first run is alive (its worker lost, cut off, or
            # a tool that outlives the visibility timeout), or sent back to wait for it:
            # not a sign of poison. Wait for that run instead.
            return self._first_run(claim)
        if not guard.counts(redelivered=self.redelivered, chunk_item=self.chunk_item):
            return None
        deliveries = guard.deliveries(self.count_as)
        if deliveries <= MAX_ATTEMPTS:
            return None
        result = poison_result(self.body, deliveries)
        if deliveries == MAX_ATTEMPTS + 1:  # kept once, by the delivery that crossed the line
            record = {"skill": result.skill_name, "tool": result.tool_name}
            guard.store.dead_letter(request_id, {**record, "attempts": deliveries - 1})
        return result

    def claim(self, request: SkillInvocationRequest, tool: ToolSpec, timeout_s: float) -> None:
        """Claim the write before the tool starts (the runtime's ``before_write`` hook).

        Raises:
            WriteAlreadyClaimed: another run holds the claim; the tool must not start.
        """
        held = self.guard.store.claim(self.request_id, Claim.mine(timeout_s + CLAIM_GRACE_S))
        if held is None:
            self._owns_claim = True
            return
        self._held = held
        raise WriteAlreadyClaimed(held)

    def finish(self, result: SkillResult) -> SkillResult:
        """The delivery's result: a write it claimed is recorded, another run's is awaited."""
        if self._owns_claim:
            self.guard.store.finish(self.request_id, result_payload(result, self.request_id))
            return result
        if self._held is not None:
            return self._first_run(self._held)
        return result

    def _first_run(self, claim: Claim) -> SkillResult:
        """The result of the write's first run, which holds ``claim``.

        Raises:
            FirstRunGoesOn: that run may still go on, and this delivery can be sent back
                to ask again: no pool process waits for another machine's run.
        """
        if self.may_send_back and claim.running():
            raise FirstRunGoesOn()
        result, self.elsewhere = self.guard.await_first_run(self.request_id, self.body, claim)
        return result
