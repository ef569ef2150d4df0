"""Where a soak's recovery went: each chaos event's probe, and the story of the slowest.

A probe is a quick read sent as a chaos event begins; its recovery is the time from
then to its stored result. ``timeline`` reads what the worker logs and the fault
tool's records say of one probe: which worker received it and when (Celery's
``received`` line), when the tool ran and in which process (the records), when the
task succeeded (the log), and when the result was seen stored (the soak's watch).
The gaps between those say where the time went: in the broker (sent to received),
in the worker before the tool (received to ran: a full pool, the pipeline's Redis
round trips), or after it (ran to stored: the result store).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Probe", "Step", "bound_s", "queued_ahead", "timeline", "timeline_lines"]

#: Events whose probe also waits out an outage the event makes itself (Redis away,
#: RabbitMQ's connections dropped): their bound is the recovery time plus that outage.
OUTAGES = frozenset({"kill -9 redis", "drop rabbitmq connections"})
_RECEIVED = re.compile(
    r"^\[([^\]]+?),(\d{3}): INFO/MainProcess\] Task skills\.invoke(_chunk)?\[([^\]]+)\] received"
)
_SERIAL = re.compile(r"-(\d{7})$")
_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}): (\w+)/([^\]]+)\] (.*)$")


@dataclass
class Probe:
    """One chaos event's probe: sent at ``sent_at`` (epoch s), stored ``took_s`` later."""

    request_id: str
    event: str
    sent_at: float
    outage_s: float = 0.0  # how long the event itself kept a server away
    took_s: float = float("inf")


@dataclass
class Step:
    """One thing that happened to a probe: when (epoch s), where, what."""

    at: float
    where: str
    what: str
    details: list[str] = field(default_factory=list)


def bound_s(probe: Probe, recovery_s: float) -> float:
    """The longest ``probe`` may take: the recovery time, plus the outage its event made."""
    return recovery_s + (probe.outage_s if probe.event in OUTAGES else 0.0)


def _log_steps(request_id: str, name: str, log: Path) -> list[Step]:
    steps = []
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return []
    for line in text.splitlines():
        if request_id not in line:
            continue
        match = _STAMP.match(line)
        if match is None:
            continue
        day, millis, level, process, message = match.groups()
        at = time.mktime(time.strptime(day, "%Y-%m-%d %H:%M:%S")) + int(millis) / 1000
        what = message.replace(request_id, "<probe>")[:120]
        steps.append(Step(at, f"{name} {process}", f"{level}: {what}"))
    return steps


def timeline(
    probe: Probe, logs: dict[str, Path], records: list[tuple[str, int, float]]
) -> list[Step]:
    """What happened to ``probe``, in order: its sending, each worker log line that
    names it, each run of its tool (pid), and its result seen stored."""
    steps = [Step(probe.sent_at, "soak", f"sent as '{probe.event}' began")]
    for name, log in logs.items():
        steps += _log_steps(probe.request_id, name, log)
    steps += [
        Step(at, f"pid {pid}", "the tool ran")
        for key, pid, at in records
        if key == probe.request_id
    ]
    if probe.took_s != float("inf"):
        steps.append(Step(probe.sent_at + probe.took_s, "soak", "result seen stored"))
    return sorted(steps, key=lambda step: step.at)


def _receipts(logs: dict[str, Path]) -> list[tuple[float, str, bool]]:
    """Every receipt in the worker logs: (when, task id, a batch chunk's)."""
    found = []
    for log in logs.values():
        try:
            lines = log.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            match = _RECEIVED.match(line)
            if match is None:
                continue
            day, millis, chunk, task_id = match.groups()
            at = time.mktime(time.strptime(day, "%Y-%m-%d %H:%M:%S")) + int(millis) / 1000
            found.append((at, task_id, bool(chunk)))
    return found


def queued_ahead(probe: Probe, logs: dict[str, Path]) -> tuple[int, int]:
    """What workers received between the probe's sending and its first receipt: how many
    invocations sent before it (ids carry the soak's serial), and how many batch chunks.
    A line that long ahead of it is time spent waiting in the queue, not in recovery."""
    receipts = _receipts(logs)
    mine = [at for at, task_id, _ in receipts if task_id == probe.request_id]
    serial = _SERIAL.search(probe.request_id)
    if not mine or serial is None:
        return 0, 0
    older = chunks = 0
    for at, task_id, chunk in receipts:
        if not probe.sent_at <= at < min(mine):
            continue
        if chunk:
            chunks += 1
            continue
        other = _SERIAL.search(task_id)
        older += int(other is not None and int(other.group(1)) < int(serial.group(1)))
    return older, chunks


def timeline_lines(probe: Probe, steps: list[Step]) -> list[str]:
    """The timeline as lines: seconds after the probe was sent, where, what, the gap."""
    lines = [f"slowest probe {probe.request_id} ('{probe.event}', {probe.took_s:.1f} s):"]
    last = probe.sent_at
    for step in steps:
        gap = step.at - last
        mark = f"  (+{gap:.1f} s)" if gap >= 1.0 else ""
        lines.append(f"  {step.at - probe.sent_at:7.2f} s  {step.where:<28} {step.what}{mark}")
        last = step.at
    return lines
