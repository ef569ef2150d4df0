"""The approver's side: what waits, what it asks, and a decision that sends it on.

A decision is stored once (``ApprovalStore.decide``), then the invocation's message
is sent again, under its request id, with the request as it was parked: the worker
that takes it finds the decision and runs it (approved) or ends it
(``permission_denied``). The message carries nothing that approves it: only the
stored decision does, and only an approver's Redis user may write one.

An approval is bound to what was shown: it names the content digest of the body the
desk read (``approve(..., digest=)``: of what ``show`` showed, a prefix of at least
12 hex digits), it is stored only while the parked record still has that digest,
the message sent on is that very body, and a worker runs a delivery only when its
own digest is the decision's.
"""

from __future__ import annotations

import datetime as dt
import getpass
import re
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from cleveragents.approvals.model import (
    APPROVED,
    REJECTED,
    ApprovalError,
    Decision,
    Outcome,
    Parked,
    changed_since_shown,
)
from cleveragents.pipeline.binding import content_digest
from cleveragents.runtime.request import SkillInvocationRequest
from cleveragents.stores.approvals import ApprovalStore
from cleveragents.stores.audit import AuditLog

__all__ = ["ApprovalDesk", "local_user"]

#: The longest ``by`` and ``reason`` kept (a person's words, not a document).
MAX_BY_CHARS = 200
MAX_REASON_CHARS = 2000
#: How a person decided, each counted apart (``cleveragents_approval_decisions_total``).
CLI, PYTHON, MCP, WEB = "cli", "python", "mcp", "web"
CHANNELS = (CLI, PYTHON, MCP, WEB)
#: The shortest digest prefix ``approve --digest`` takes (48 bits: no accidental match).
MIN_DIGEST_CHARS = 12
_HEX = re.compile(r"^[0-9a-f]+$")


def local_user() -> str:
    """Who decides when ``by`` is not given: this process's user."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a uid without a name (a container)
        return "unknown"


class ApprovalDesk:
    """Lists, shows and decides parked invocations; ``send`` publishes a request."""

    def __init__(
        self, store: ApprovalStore, send: Callable[..., Any], audit_log: AuditLog | None = None
    ) -> None:
        self.store = store
        #: ``send(request, trace=...)`` publishes it, in the trace its record carries.
        self.send = send
        self.audit_log = audit_log

    def __call__(self) -> list[Parked]:
        """Deprecated: ``pending()`` (``client.approvals()`` was a method before)."""
        warnings.warn(
            "SkillClient.approvals() is deprecated: use SkillClient.approvals.pending()",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.pending()

    def audit(
        self, *, request_id: str | None = None, since: dt.datetime | None = None
    ) -> Iterator[dict[str, str]]:
        """The audit trail of writes, oldest first (never an argument value)."""
        if self.audit_log is None:
            raise ApprovalError("this desk has no audit trail")
        return self.audit_log.read(request_id=request_id, since=since)

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
        channel: str = PYTHON,
    ) -> Decision:
        """Approve it: it runs once, with exactly the arguments it was parked with.

        ``digest``: the content digest shown with it (``approvals show --json``), or a
        prefix of at least 12 hex digits; refused when the parked call is no longer that.
        ``channel``: how the person decided (``CHANNELS``), counted by the worker.
        """
        shown = self.approve_shown(request_id, digest=digest, by=by, reason=reason, channel=channel)
        return shown[1]

    def approve_shown(
        self,
        request_id: str,
        *,
        digest: str | None = None,
        by: str | None = None,
        reason: str | None = None,
        channel: str = PYTHON,
    ) -> tuple[Parked, Decision]:
        """``approve``, with the parked call it approved (whose arguments ran).

        Raises:
            ApprovalError: nothing waits under the id, it was decided or expired, it is
                no longer ``digest``, or its record does not match its own digest.
        """
        record, _ = self.store.get(request_id)
        if record is None:
            raise ApprovalError(
                f"no invocation {request_id} awaits approval (`cleveragents approvals list` "
                "shows those that do)"
            )
        if record.body.get("allow_writes") is True and self.store.parked_read_only(request_id):
            raise ApprovalError(
                f"invocation {request_id} asks for writes but is parked under read-only "
                "workers' keys, which their Redis user may write and which no write worker "
                "parks under: it is not a call a producer sent; nothing was approved"
            )
        shown = content_digest(record.body)
        if shown != record.digest:  # a record changed by hand: not what any worker parked
            raise ApprovalError(
                f"invocation {request_id}'s parked record does not match its own digest: it "
                "was changed after it was parked; nothing was approved"
            )
        if digest is not None:
            wanted = _digest_prefix(digest)
            if not shown.startswith(wanted):
                raise ApprovalError(changed_since_shown(request_id, wanted, shown))
        who = (by or "").strip()[:MAX_BY_CHARS] or local_user()
        said = (reason or "").strip()[:MAX_REASON_CHARS] or None
        asked = Decision(APPROVED, who, said, digest=shown, channel=_channel(channel))
        _, decision = self.store.decide(request_id, asked)
        # The body read and hashed here, not the record as the store found it: whatever
        # changed in between, what is sent on is what was approved.
        self.send(SkillInvocationRequest.model_validate(record.body), trace=record.trace)
        return record, decision

    def reject(
        self, request_id: str, *, reason: str, by: str | None = None, channel: str = PYTHON
    ) -> Decision:
        """Reject it: it ends as ``permission_denied`` with ``reason`` for the agent to read."""
        if not reason or not reason.strip():
            raise ApprovalError("a rejection needs a reason (--reason): the agent reads it")
        return self._decide(request_id, REJECTED, by, reason, _channel(channel))

    def _decide(
        self, request_id: str, outcome: Outcome, by: str | None, reason: str | None, channel: str
    ) -> Decision:
        who = (by or "").strip()[:MAX_BY_CHARS] or local_user()
        said = (reason or "").strip()[:MAX_REASON_CHARS] or None
        wanted = Decision(outcome, who, said, channel=channel)
        record, decision = self.store.decide(request_id, wanted)
        self.send(SkillInvocationRequest.model_validate(record.body), trace=record.trace)
        return decision


def _channel(channel: str) -> str:
    return channel if channel in CHANNELS else PYTHON


def _digest_prefix(digest: str) -> str:
    """``--digest``: a whole SHA-256 in hex, or a prefix of at least ``MIN_DIGEST_CHARS``.

    Raises:
        ApprovalError: it is not hex, or too short to name one call.
    """
    wanted = digest.strip().lower()
    if not _HEX.match(wanted) or not MIN_DIGEST_CHARS <= len(wanted) <= 64:
        raise ApprovalError(
            f"--digest {digest!r}: give the digest `cleveragents approvals show ID --json` "
            f"prints, or at least its first {MIN_DIGEST_CHARS} hex digits"
        )
    return wanted
