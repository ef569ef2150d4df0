"""Parked invocations that nobody decided in time, or whose decision's message was lost, sent on.

An expiry is no event: nothing sends the invocation's message again when its
time is up. A thread of the worker's main process looks at the parked
invocations every few seconds and sends the message of each one past its expiry
(the delivery ends it as ``approval_expired``), and of each one decided a while
ago and still parked (the approver's send was lost: its process died between
the decision and the send). A message sent is not sent again for a while: the
delivery settles it meanwhile.

A sweep sends only a body it can verify: a record of its own fleet's keys (which
only its role may write), whose body is the request it names, matches the digest it
was parked under, and asks for a tool that needs approval in this worker's
catalogue. Anything else (a record planted or rewritten by hand) is never sent: it
is logged once as a warning (names only) and left as a ``refused`` audit event.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from cleveragents.approvals.model import Decision, Parked
from cleveragents.constants import QUEUE_READ, QUEUE_WRITE, TASK_INVOKE
from cleveragents.messages import redacted_repr
from cleveragents.pipeline.binding import content_digest
from cleveragents.stores.approvals import ApprovalStore
from cleveragents.stores.audit import AuditLog, event

__all__ = ["ApprovalSweep", "sweep_interval_s", "unverified"]

log = logging.getLogger("cleveragents.worker")

#: A decision's message is sent again once the decision is this old, still unsettled.
DECIDED_GRACE_S = 60.0
#: A message this sweep sent is not sent again before this many seconds.
RESEND_AFTER_S = 60.0
#: The ``gate`` of the ``refused`` audit event of a parked record a sweep would not send.
GATE_UNVERIFIED = "unverified_parked_record"
#: Whether runs of a catalogue tool need approval: (skill, tool) -> bool.
Needs = Callable[[str, str], bool]


def _no_tool_needs(skill: str, tool: str) -> bool:
    """The default of ``ApprovalSweep``'s ``needs``: nothing is verified, nothing sent."""
    return False


def unverified(record: Parked, needs: Needs) -> str | None:
    """Why a sweep must not send ``record``'s body on (None: it may)."""
    body = record.body
    if not isinstance(body, dict) or body.get("request_id") != record.request_id:
        return "its body names another request id"
    if content_digest(body) != record.digest:
        return "its body does not match the digest it was parked under"
    skill, tool = body.get("skill"), body.get("tool")
    if not isinstance(skill, str) or not isinstance(tool, str) or not needs(skill, tool):
        return "its tool needs no approval in this worker's catalogue"
    return None


def sweep_interval_s(ttl_s: float) -> float:
    """How often parked invocations are looked at: a quarter of the time to live,
    between half a second and 30 seconds."""
    return min(30.0, max(0.5, ttl_s / 4))


class ApprovalSweep:
    """The thread that sends on what expired, or what was decided and not sent."""

    def __init__(
        self,
        app: Any,
        store: ApprovalStore,
        ttl_s: float,
        *,
        read_only: bool = False,
        needs: Needs = _no_tool_needs,
        audit: AuditLog | None = None,
    ) -> None:
        self.app = app
        self.store = store
        #: Whether a catalogue tool needs approval: only such a tool's record is sent on.
        self.needs = needs
        #: Where a record that is not sent leaves its ``refused`` event.
        self.audit = audit
        self._refused: set[str] = set()
        #: A read-only worker sends on no write (its Redis user may not publish one).
        self.read_only = read_only
        self.interval_s = sweep_interval_s(ttl_s)
        self._sent: dict[str, float] = {}
        self._stop = threading.Event()

    def start(self) -> None:
        thread = threading.Thread(target=self._loop, name="cleveragents-approvals", daemon=True)
        thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sweep_once()
            except Exception as exc:  # Redis away a moment: the next pass tries again
                log.warning("could not look at the parked invocations: %s", exc)

    def sweep_once(self, now: float | None = None) -> int:
        """Send on what is due; how many were sent."""
        now = time.time() if now is None else now
        self._sent = {k: at for k, at in self._sent.items() if now - at < RESEND_AFTER_S}
        sent = 0
        for record, decision in self.store.waiting():
            if record.request_id in self._sent or not _due(record, decision, now):
                continue
            if self.read_only and record.body.get("allow_writes") is True:
                continue  # a worker that may write sends it on
            why = unverified(record, self.needs)
            if why is not None:
                self._refuse(record, why)
                continue
            self._sent[record.request_id] = now
            try:
                self._send(record)
            except Exception as exc:  # this one is tried again later; the others go on
                log.warning("could not send on parked invocation %s: %s", record.request_id, exc)
                continue
            sent += 1
        return sent

    def _refuse(self, record: Parked, why: str) -> None:
        """Tell once of a record that is not sent on: a warning and a ``refused`` event."""
        if record.request_id in self._refused:
            return
        self._refused.add(record.request_id)
        log.warning(
            "parked invocation %s (%s / %s) not sent on: %s; it was not parked by a worker "
            "of this fleet as it is, and will not run",
            record.request_id,
            record.skill,
            record.tool,
            why,
        )
        if self.audit is None:
            return
        refused = event(
            "refused",
            record.request_id,
            record.skill,
            record.tool,
            content_digest(record.body),
            gate=GATE_UNVERIFIED,
        )
        try:
            self.audit.append([refused])
        except Exception as exc:  # the warning above stands
            log.warning("audit event of %s not written: %s", record.request_id, exc)

    def _send(self, record: Parked) -> None:
        body = record.body
        writes = body.get("allow_writes") is True
        self.app.send_task(
            TASK_INVOKE,
            args=[body],
            task_id=record.request_id,
            queue=QUEUE_WRITE if writes else QUEUE_READ,
            argsrepr=redacted_repr(body),
            kwargsrepr="{}",
            headers=dict(record.trace or {}),  # the run joins the submitter's trace
        )


def _due(record: Parked, decision: Decision | None, now: float) -> bool:
    if decision is not None:
        return now - decision.at >= DECIDED_GRACE_S
    return now >= record.expires_at
