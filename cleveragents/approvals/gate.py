"""The worker's side of approvals: park an invocation that needs one, act on the decision.

Called by the runtime after the write gates and schema validation passed (and the
request id was bound), right before the tool would start: a refused or invalid
request never reaches a person. The first delivery parks the invocation in the
approval store and ends (``AwaitingApproval``): no pool process waits for it. A
person's decision sends the message again (``desk.py``), or the worker's sweep
does once it expired (``worker/approval_sweep.py``); that delivery finds the
decision: approved, it runs, under the usual write claim; rejected or expired, it
ends as ``permission_denied``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cleveragents.approvals.model import (
    APPROVED,
    EXPIRED,
    REASON_EXPIRED,
    REASON_REJECTED,
    WAITING,
    AwaitingApproval,
    Parked,
    Resolution,
)
from cleveragents.errors import WriteRefused
from cleveragents.skills import ToolSpec
from cleveragents.stores.approvals import ApprovalStore

__all__ = ["ApprovalGate", "needs_approval"]


def needs_approval(tool: ToolSpec, for_writes: bool) -> bool:
    """Whether runs of ``tool`` wait for a person (``for_writes``: the deployment's
    ``CLEVERAGENTS_APPROVAL_FOR_WRITES``)."""
    return tool.requires_approval or (for_writes and tool.write_capable)


def _no_park(resolution: Resolution) -> None:
    """The default of ``ApprovalGate.on_park``: nothing is told."""


@dataclass(frozen=True)
class ApprovalGate:
    """Parks what needs approval; lets through what was approved; ends the rest."""

    store: ApprovalStore
    ttl_s: float
    for_writes: bool = False
    #: Told of every delivery that leaves its invocation parked (the worker stores its
    #: ``AWAITING_APPROVAL`` state there).
    on_park: Callable[[Resolution], None] = _no_park
    #: Told once of each change: parked now, or settled now (the worker counts them).
    on_change: Callable[[Resolution], None] = _no_park

    def needs(self, tool: ToolSpec) -> bool:
        return needs_approval(tool, self.for_writes)

    def resolve(
        self,
        request_id: str,
        body: dict[str, Any],
        tool: ToolSpec,
        digest: str,
        asked_by: str | None,
        trace: Mapping[str, str] | None = None,
    ) -> Resolution:
        """Park this delivery's invocation, or find what became of it (one round trip)."""
        asked = Parked(
            request_id=request_id,
            skill=str(body.get("skill") or ""),
            tool=tool.name,
            digest=digest,
            body={**body, "request_id": request_id},
            asked_by=asked_by,
            trace=dict(trace) if trace else None,
        )
        resolution = self.store.resolve(asked, self.ttl_s)
        if resolution.changed:
            self.on_change(resolution)
        return resolution

    def enforce(self, resolution: Resolution) -> None:
        """Return when the invocation may run (approved).

        Raises:
            AwaitingApproval: parked (now, or still): the tool must not start.
            WriteRefused: rejected, or expired undecided (``permission_denied``).
        """
        decided = resolution.decision
        if resolution.state == APPROVED and decided is not None and decided.outcome == APPROVED:
            return
        if resolution.state in (WAITING, APPROVED):  # approved without a decision: not by a person
            self.on_park(resolution)
            raise AwaitingApproval(resolution)
        raise _refusal(resolution)


def _refusal(resolution: Resolution) -> WriteRefused:
    record, decision = resolution.record, resolution.decision
    if resolution.state == EXPIRED or decision is None:
        return WriteRefused(
            f"invocation {record.request_id} of {record.tool} waited for approval until it "
            "expired (CLEVERAGENTS_APPROVAL_TTL_S) and did not run: send it again under a new "
            "request id to ask again",
            details={"reason": REASON_EXPIRED},
        )
    said = f": {decision.reason}" if decision.reason else ""
    return WriteRefused(
        f"invocation {record.request_id} of {record.tool} was rejected by {decision.by}"
        f"{said}; it did not run",
        details={"reason": REASON_REJECTED, "approval_reason": decision.reason, "by": decision.by},
    )
