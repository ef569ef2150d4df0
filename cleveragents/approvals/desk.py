"""The approver's side: what waits, what it asks, and a decision that sends it on.

A decision is stored once (``ApprovalStore.decide``), then the invocation's message
is sent again, under its request id, with the request as it was parked: the worker
that takes it finds the decision and runs it (approved) or ends it
(``permission_denied``). The message carries nothing that approves it: only the
stored decision does, and only an approver's Redis user may write one.
"""

from __future__ import annotations

import getpass
from collections.abc import Callable
from typing import Any

from cleveragents.approvals.model import (
    APPROVED,
    REJECTED,
    ApprovalError,
    Decision,
    Outcome,
    Parked,
)
from cleveragents.runtime.request import SkillInvocationRequest
from cleveragents.stores.approvals import ApprovalStore

__all__ = ["ApprovalDesk", "local_user"]

#: The longest ``by`` and ``reason`` kept (a person's words, not a document).
MAX_BY_CHARS = 200
MAX_REASON_CHARS = 2000


def local_user() -> str:
    """Who decides when ``by`` is not given: this process's user."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a uid without a name (a container)
        return "unknown"


class ApprovalDesk:
    """Lists, shows and decides parked invocations; ``send`` publishes a request."""

    def __init__(self, store: ApprovalStore, send: Callable[..., Any]) -> None:
        self.store = store
        #: ``send(request, trace=...)`` publishes it, in the trace its record carries.
        self.send = send

    def pending(self, limit: int = 1000) -> list[Parked]:
        """The invocations that wait for a decision, oldest first."""
        return [record for record, decision in self.store.waiting(limit) if decision is None]

    def show(self, request_id: str) -> tuple[Parked, Decision | None]:
        """The parked invocation ``request_id`` (its arguments too) and its decision.

        Raises:
            ApprovalError: no invocation was parked under this id.
        """
        record, decision = self.store.get(request_id)
        if record is None:
            raise ApprovalError(
                f"no invocation {request_id} awaits or awaited approval (`cleveragents "
                "approvals list` shows those that wait)"
            )
        return record, decision

    def approve(
        self,
        request_id: str,
        *,
        digest: str | None = None,
        by: str | None = None,
        reason: str | None = None,
    ) -> Decision:
        """Approve it: it runs once, with exactly the arguments it was parked with.

        ``digest`` (the content digest of what the approver saw) is accepted here and
        not yet checked: the check is issue 42 item 2's, on its own branch.
        """
        return self._decide(request_id, APPROVED, by, reason)

    def reject(self, request_id: str, *, reason: str, by: str | None = None) -> Decision:
        """Reject it: it ends as ``permission_denied`` with ``reason`` for the agent to read."""
        if not reason or not reason.strip():
            raise ApprovalError("a rejection needs a reason (--reason): the agent reads it")
        return self._decide(request_id, REJECTED, by, reason)

    def _decide(
        self, request_id: str, outcome: Outcome, by: str | None, reason: str | None
    ) -> Decision:
        who = (by or "").strip()[:MAX_BY_CHARS] or local_user()
        said = (reason or "").strip()[:MAX_REASON_CHARS] or None
        record, decision = self.store.decide(request_id, Decision(outcome, who, said))
        self.send(SkillInvocationRequest.model_validate(record.body), trace=record.trace)
        return decision
