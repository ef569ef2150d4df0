"""Parked invocations that nobody decided in time, or whose decision's message was lost, sent on.

An expiry is no event: nothing sends the invocation's message again when its
time is up. A thread of the worker's main process looks at the parked
invocations every few seconds and sends the message of each one past its expiry
(the delivery ends it as ``approval_expired``), and of each one decided a while
ago and still parked (the approver's send was lost: its process died between
the decision and the send). A message sent is not sent again for a while: the
delivery settles it meanwhile.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from cleveragents.approvals.model import Decision, Parked
from cleveragents.constants import QUEUE_READ, QUEUE_WRITE, TASK_INVOKE
from cleveragents.messages import redacted_repr
from cleveragents.stores.approvals import ApprovalStore

__all__ = ["ApprovalSweep", "sweep_interval_s"]

log = logging.getLogger("cleveragents.worker")

#: A decision's message is sent again once the decision is this old, still unsettled.
DECIDED_GRACE_S = 60.0
#: A message this sweep sent is not sent again before this many seconds.
RESEND_AFTER_S = 60.0


def sweep_interval_s(ttl_s: float) -> float:
    """How often parked invocations are looked at: a quarter of the time to live,
    between half a second and 30 seconds."""
    return min(30.0, max(0.5, ttl_s / 4))


class ApprovalSweep:
    """The thread that sends on what expired, or what was decided and not sent."""

    def __init__(
        self, app: Any, store: ApprovalStore, ttl_s: float, *, read_only: bool = False
    ) -> None:
        self.app = app
        self.store = store
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
            self._sent[record.request_id] = now
            try:
                self._send(record)
            except Exception as exc:  # this one is tried again later; the others go on
                log.warning("could not send on parked invocation %s: %s", record.request_id, exc)
                continue
            sent += 1
        return sent

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
