"""What an approval is: a parked invocation, a person's decision, and the rules between them.

A worker parks an invocation whose tool needs approval (``Parked``): the request as
it arrived, bound to its content digest, with the time it was asked and the time
it expires. A person decides it once (``Decision``): approved or rejected, by whom,
why, when. The rules (``decide`` for the person, ``resolve`` for the worker that
receives the invocation again) are written once here for the file and in-memory
stores; the Redis store keeps the same rules in its two scripts.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from typing import Any, Final, Literal

from cleveragents.errors import CleverAgentsError

__all__ = [
    "APPROVED",
    "EXPIRED",
    "REASON_EXPIRED",
    "REASON_REJECTED",
    "REJECTED",
    "WAITING",
    "ApprovalError",
    "AwaitingApproval",
    "Decision",
    "Parked",
    "Resolution",
    "changed_since_shown",
    "decide",
    "resolve",
]

#: A parked invocation's states: waiting for a person, then what became of it.
WAITING, EXPIRED = "waiting", "expired"
APPROVED: Final = "approved"
REJECTED: Final = "rejected"
#: ``details["reason"]`` of the ``permission_denied`` result of a rejected invocation.
REASON_REJECTED = "approval_rejected"
#: ``details["reason"]`` of the ``permission_denied`` result of one nobody decided in time.
REASON_EXPIRED = "approval_expired"

Outcome = Literal["approved", "rejected"]


class ApprovalError(CleverAgentsError, ValueError):
    """A decision that cannot be taken (unknown id, decided already, expired): one line
    that says why; nothing was changed."""


@dataclass(frozen=True)
class Parked:
    """An invocation waiting for (or past) a person's decision."""

    request_id: str
    skill: str
    tool: str
    #: The content digest its id is bound to: the decision is for exactly these arguments.
    digest: str
    #: The request as it arrived (arguments included: the approver sees what they approve).
    body: dict[str, Any]
    #: Who sent it, where the message says (Celery's ``origin``: process and host).
    asked_by: str | None
    asked_at: float = 0.0
    expires_at: float = 0.0
    state: str = WAITING
    #: The trace context its message carried (``traceparent``, ``tracestate``): the run
    #: a decision sends on joins the submitter's trace, not the approver's.
    trace: dict[str, str] | None = None

    def encode(self) -> str:
        """The record as JSON, without its times and state (kept beside it)."""
        fields = asdict(self)
        for kept_apart in ("asked_at", "expires_at", "state"):
            fields.pop(kept_apart)
        return json.dumps(fields, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str | bytes, *, asked_at: float, expires_at: float, state: str) -> Parked:
        """A record from ``encode``'s JSON and the fields kept beside it."""
        fields = json.loads(text)
        return cls(**fields, asked_at=asked_at, expires_at=expires_at, state=state)

    def summary(self) -> dict[str, Any]:
        """What a list shows: everything but the arguments."""
        return {
            "request_id": self.request_id,
            "skill": self.skill,
            "tool": self.tool,
            "asked_by": self.asked_by,
            "asked_at": self.asked_at,
            "expires_at": self.expires_at,
            "state": self.state,
        }


@dataclass(frozen=True)
class Decision:
    """A person's answer to one parked invocation."""

    outcome: Outcome
    by: str
    reason: str | None
    #: Filled in by the store, on its own clock.
    at: float = 0.0
    #: The content digest of what the person was shown and decided: a decision counts
    #: only for a delivery whose own content has exactly this digest. Empty in a wanted
    #: decision: the parked record's, whatever it is now (a rejection needs no more).
    digest: str = ""
    #: How the person decided: ``cli``, ``python``, ``mcp`` or ``web`` (counted by channel).
    channel: str = ""

    def encode(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def decode(cls, text: str | bytes) -> Decision:
        return cls(**json.loads(text))


@dataclass(frozen=True)
class Resolution:
    """What a worker that received a parked invocation's message found.

    ``state``: ``waiting`` (parked, now or before), ``approved``, ``rejected`` or
    ``expired``. ``changed``: this delivery parked it or settled it (its audit event
    and its count are written once, by this delivery).
    """

    state: str
    record: Parked
    decision: Decision | None
    changed: bool


class AwaitingApproval(Exception):
    """Raised by the approval gate instead of running a tool: the invocation is parked."""

    def __init__(self, resolution: Resolution) -> None:
        super().__init__(f"invocation {resolution.record.request_id} awaits approval")
        self.resolution = resolution


def resolve(
    record: Parked | None, decision: Decision | None, asked: Parked, now: float, ttl_s: float
) -> tuple[Resolution, Parked | None]:
    """A worker's rule: the resolution of a delivery of ``asked``, and the record to keep
    (None: unchanged).

    Not parked yet: parked now, to expire ``ttl_s`` from ``now``. Parked and decided:
    settled by the decision (which the person took in time). Parked, undecided and
    past its expiry: expired.
    """
    if record is None:
        parked = replace(asked, asked_at=now, expires_at=now + ttl_s, state=WAITING)
        return Resolution(WAITING, parked, None, True), parked
    if decision is not None and decision.digest != asked.digest:
        # About other arguments than this delivery's own: no decision about these (a
        # record rewritten after the person looked, or another body under the id).
        decision = None
    if record.state != WAITING:
        return Resolution(record.state, record, decision, False), None
    if decision is not None:
        settled = replace(record, state=decision.outcome)
        return Resolution(settled.state, settled, decision, True), settled
    if now >= record.expires_at:
        expired = replace(record, state=EXPIRED)
        return Resolution(EXPIRED, expired, None, True), expired
    return Resolution(WAITING, record, None, False), None


def decide(
    request_id: str,
    record: Parked | None,
    existing: Decision | None,
    wanted: Decision,
    now: float,
) -> Decision:
    """A person's rule: the decision to store (``wanted``, timed ``now``).

    Raises:
        ApprovalError: nothing waits under ``request_id``, it was decided already, or
            it expired.
    """
    if record is None:
        raise ApprovalError(
            f"no invocation {request_id} awaits approval (`cleveragents approvals list` "
            "shows those that do)"
        )
    if existing is not None:
        raise ApprovalError(_decided(request_id, existing))
    if record.state == EXPIRED or now >= record.expires_at:
        raise ApprovalError(
            f"invocation {request_id} expired unapproved; nothing was changed: send it again "
            "under a new request id to ask again"
        )
    if record.state != WAITING:  # settled without a decision: cannot happen, said anyway
        raise ApprovalError(f"invocation {request_id} is {record.state}; nothing was changed")
    if wanted.digest and wanted.digest != record.digest:
        raise ApprovalError(changed_since_shown(request_id, wanted.digest, record.digest))
    return replace(wanted, at=now, digest=record.digest)


def changed_since_shown(request_id: str, shown: str, now: str) -> str:
    """Why a decision about what a person saw was refused: the parked call is another now."""
    return (
        f"invocation {request_id} is no longer the call that was shown (digest {shown[:12]}, "
        f"now {now[:12]}): nothing was decided; look again with `cleveragents approvals show "
        f"{request_id}`"
    )


def _decided(request_id: str, existing: Decision) -> str:
    why = f" ({existing.reason})" if existing.reason else ""
    return (
        f"invocation {request_id} was already {existing.outcome} by {existing.by}{why}; "
        "nothing was changed"
    )
