"""The audit events of one delivery of a write-capable invocation (``stores/audit.py``).

Written in at most two round trips: what came before the tool started, just before
it starts (so that a write whose worker died mid-run still shows ``started``), and
how it ended, after. A delivery that never starts the tool (refused, parked,
settled by a decision) writes once, as it ends. ``requested`` is written by an
invocation's first delivery only: not by a redelivery, a retry, a wait for a limit
or the delivery that a decision sent again.
"""

from __future__ import annotations

import logging
from typing import Any

from cleveragents.approvals.model import EXPIRED, REJECTED, WAITING, Resolution
from cleveragents.errors import SkillErrorType
from cleveragents.skills import SkillResult
from cleveragents.stores.audit import AuditLog, event

__all__ = ["WriteTrail"]

log = logging.getLogger("cleveragents.worker")

#: Failures before the tool started that are refusals (a gate, or what was asked).
_REFUSALS = frozenset({SkillErrorType.PERMISSION_DENIED, SkillErrorType.VALIDATION_ERROR})


class WriteTrail:
    """Collects one delivery's events and appends them to the audit log."""

    def __init__(
        self, log: AuditLog, request_id: str, skill: str, tool: str, digest: str, *, first: bool
    ) -> None:
        self.log = log
        self.request_id, self.skill, self.tool, self.digest = request_id, skill, tool, digest
        self.pending: list[dict[str, str]] = []
        self.started = False
        #: A decision (or its absence) ended it: its event says so, nothing more.
        self.settled = False
        if first:
            self.add("requested")

    def add(self, name: str, **extra: str | None) -> None:
        self.pending.append(
            event(name, self.request_id, self.skill, self.tool, self.digest, **extra)
        )

    def flush(self) -> None:
        """Append what was collected (never fails the run: a lost event is logged)."""
        pending, self.pending = self.pending, []
        try:
            self.log.append(pending)
        except Exception as exc:  # the run goes on; the operator is told what is missing
            names = ", ".join(e["event"] for e in pending)
            log.warning("audit events of %s not written (%s): %s", self.request_id, names, exc)

    def approval(self, resolution: Resolution) -> None:
        """What the approval gate found: an event where this delivery changed it."""
        parked_now = resolution.state == WAITING and resolution.changed
        if not parked_now:  # it was parked before: this delivery was not the request
            self.pending = [e for e in self.pending if e["event"] != "requested"]
        self.settled = resolution.state in (REJECTED, EXPIRED)
        if not resolution.changed:
            return
        if parked_now:
            self.add("awaiting_approval")
            return
        decision = resolution.decision
        by = decision.by if decision is not None else None
        reason = decision.reason if decision is not None else None
        self.add(resolution.state, by=by, reason=reason)

    def on_start(self, *_: Any) -> None:
        """The tool starts now (a ``RunHooks.on_start``)."""
        self.started = True
        self.add("started")
        self.flush()

    def ended(self, result: SkillResult) -> None:
        """How the delivery ended."""
        error = result.error
        if self.started:
            self.add("succeeded" if error is None else "failed", error_type=_type(result))
        elif self.settled:
            pass
        elif error is not None and error.error_type in _REFUSALS:
            gate = error.details.get("gate") or error.details.get("reason")
            self.add("refused", gate=str(gate) if gate else None, error_type=_type(result))
        elif error is not None:
            self.add("failed", error_type=_type(result))
        self.flush()


def _type(result: SkillResult) -> str | None:
    return result.error.error_type.value if result.error is not None else None
