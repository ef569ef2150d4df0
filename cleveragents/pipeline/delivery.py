"""One delivery of one invocation, decided once: what carried it, and what became of it.

``Pipeline.deliver`` takes a ``Delivery`` (a single message, or one line of a batch
chunk: the same thing to it) through every policy in one order: the tool's
fleet-wide limits, the answer that needs no run (its id bound to other content,
cancelled, or finished already), the guard and the runtime (gates, approval,
validation, the tool), the permits given back, the retry decided, the outcome
observed. It returns one ``Outcome``; the Celery task and the chunk runner only
translate it into their terms (a stored result, a message sent back with a delay,
``Ignore``), and never repeat a step of it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from cleveragents.approvals.model import Resolution
from cleveragents.skills import SkillResult
from cleveragents.skills.catalogue import ToolPolicies
from cleveragents.stores import StartedMark

__all__ = [
    "ANSWERED",
    "DROPPED",
    "PARKED",
    "RAN",
    "RETRY",
    "WAIT",
    "Delivery",
    "Outcome",
]

#: What became of a delivery (``Outcome.kind``).
OutcomeKind = Literal["ran", "answered", "wait", "retry", "parked", "dropped"]
#: It ran (or the guard settled it: a poison message, another run's write): ``result``.
RAN: OutcomeKind = "ran"
#: It must not run and a result answers it without a run: ``result`` is that answer
#: (``cancelled``, to store; ``request_id_reused``, observed already, never stored;
#: or the result stored already, with ``stored`` true).
ANSWERED: OutcomeKind = "answered"
#: Over its tool's limits: send it back, the same attempt, after ``delay_s``.
WAIT: OutcomeKind = "wait"
#: It failed transiently and its tool retries: send attempt + 1 after ``delay_s``
#: (``result`` is this attempt's failure, observed as retried, never stored).
RETRY: OutcomeKind = "retry"
#: Its tool needs a person's approval: parked (``resolution``); no result yet.
PARKED: OutcomeKind = "parked"
#: Its run's result is dropped: another delivery's stands (``Delivery.finished_elsewhere``).
DROPPED: OutcomeKind = "dropped"


@dataclass(frozen=True)
class Delivery:
    """One delivery as the pipeline needs it, whatever carried it."""

    body: object
    request_id: str
    #: The broker marked its message as delivered before (or its chunk came back).
    redelivered: bool
    #: A line of a batch chunk (its binding and stored result were looked up in bulk).
    chunk_item: bool = False
    #: Tells a message sent back (a retry, a wait) from the others under its id.
    resent: str = ""
    #: Which attempt this is (1: the first).
    attempt: int = 1
    #: Who sent it (Celery's ``origin``), and the trace context its message carried.
    asked_by: str | None = None
    trace: Mapping[str, str] | None = None
    #: Stored as the invocation's ``STARTED`` state once it is known to run.
    started: StartedMark | None = None
    #: Asked of a run's result before it is reported: True when another delivery's
    #: result stands (its worker was paused meanwhile) and this one is dropped.
    finished_elsewhere: Callable[[SkillResult], bool] | None = None
    #: Whether its carrier can send it back with a delay: else no limit is taken and no
    #: retry decided (a chunk run without a ``defer``, as some tests run one).
    may_send_back: bool = True


@dataclass(frozen=True)
class Outcome:
    """What became of one delivery: the one decision its carrier translates."""

    kind: OutcomeKind
    result: SkillResult | None = None
    #: ``wait`` and ``retry``: how long before it is sent again (seconds).
    delay_s: float = 0.0
    #: ``wait``: for its write's first run, which may still go on (else: for its
    #: tool's limits).
    first_run: bool = False
    #: ``ran``: the result is another run's write (that run counted and logged it).
    elsewhere: bool = False
    #: ``answered``: the result was stored already (nothing to store).
    stored: bool = False
    #: ``parked``: what the approval gate found.
    resolution: Resolution | None = None
    #: The tool's policies, where the catalogue has the tool.
    found: ToolPolicies | None = None
