"""Each worker process's counters and duration histograms, flushed to the metric store.

Workers count invocations by skill, tool, outcome, error type and failure reason,
and their durations in histogram buckets by skill, tool and outcome, in memory,
and add them to their metric store every ``FLUSH_S`` (one pipeline per process
with Redis, not a round trip per invocation; the embedded default drops them).
A process that exits flushes what is pending (``MetricsRecorder.close``); one
that is killed outright loses at most its last ``FLUSH_S`` of counts. A worker
starts every catalogue tool's series at zero (``MetricsRecorder.start``), so the
first invocation of a tool is an increase that ``increase()`` and ``rate()`` see.
The store's fields are JSON arrays of label values (``MetricCounts``); the first
label of a limit wait's or an approval's field names its kind (``WAITS_LABEL``,
``WAITED_MS_LABEL``, ``APPROVALS_LABEL``). ``cleveragents.metrics.exporter`` reads them.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable

from cleveragents.skills import SkillResult
from cleveragents.stores import MetricCounts, MetricStore

__all__ = [
    "APPROVALS_LABEL",
    "APPROVAL_OUTCOMES",
    "BUCKETS",
    "CLOSE_WAIT_S",
    "FLUSH_S",
    "MAX_CACHED_SERIES",
    "REASONS",
    "WAITED_MS_LABEL",
    "WAITS_LABEL",
    "ZERO_SERIES",
    "MetricsRecorder",
    "reason_label",
    "zero_counts",
]

log = logging.getLogger("cleveragents.metrics")  # its name before the split

#: Histogram buckets of invocation durations, in seconds: 1 ms (an in-process python
#: tool, a refusal), a 1-2.5-5 ladder from 5 ms to 10 s, then the minutes command and
#: MCP tools take, up to CLEVERAGENTS_MAX_TIMEOUT_S's default hour; 300 s is the
#: default timeout. docs/operations.md says why.
BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
)
#: Seconds between two flushes of a process's counters to its metric store: what a
#: process killed outright (SIGKILL, the OOM killer) can lose at most.
FLUSH_S = 1.0
#: Longest a process's last flush may take at its exit (a store that is away).
CLOSE_WAIT_S = 5.0

#: Every ``details["reason"]`` that becomes a ``reason`` label as it is; any other
#: is ``"other"``, and a failure without one (or a success) has ``""``. A fixed set,
#: so that a tool cannot grow the number of series.
REASONS = frozenset(
    {
        "timeout",  # a tool stopped at its timeout, or ended by the hard time limit
        "output_too_large",  # CLEVERAGENTS_MAX_OUTPUT_BYTES
        "poison_message",  # the guard gave up on an invocation that ends its process
        "write_already_started",  # a redelivered write whose first run still holds it
        "write_interrupted",  # a write whose process died before it reported back
        "request_id_reused",  # a request id bound to other content
        "revoked",  # an invocation revoked before it ended
        "cancelled",  # an invocation cancelled before it started
        "retried",  # an attempt that failed for a reason that may pass, tried again
        "approval_rejected",  # a person rejected it (docs/approvals.md)
        "approval_expired",  # nobody decided within CLEVERAGENTS_APPROVAL_TTL_S
    }
)
OTHER_REASON = "other"
#: First label of the invocation-hash fields that count waits for a tool's limits, and
#: the milliseconds waited (three labels: no invocation series has that many).
WAITS_LABEL = "limit_wait"
WAITED_MS_LABEL = "limit_wait_ms"
#: First label of the fields that count approvals (skill, tool, outcome: four labels).
APPROVALS_LABEL = "approval"
#: First label of the fields that count people's decisions (channel, outcome: three labels).
DECISIONS_LABEL = "decision"
#: What became of a parked invocation, each counted once: parked, then one of the others.
APPROVAL_OUTCOMES = ("parked", "approved", "rejected", "expired")
#: The invocation series (outcome, error_type, reason) every catalogue tool starts
#: at zero: success and the failures a known tool can have.
ZERO_SERIES = (
    ("success", "", ""),
    ("failure", "validation_error", ""),
    ("failure", "permission_denied", ""),
    ("failure", "tool_activation_failure", ""),
    ("failure", "tool_execution_failure", ""),
    ("failure", "tool_execution_failure", "timeout"),
    ("failure", "tool_execution_failure", "output_too_large"),
)
OUTCOMES = ("success", "failure")

#: What ``known(skill, tool)`` answers: whether the names are the catalogue's.
KnownTool = Callable[[str, str], bool]
#: The label of invocations naming a skill or tool the catalogue does not have.
UNKNOWN_LABEL = "unknown"
#: Longest label value kept.
MAX_LABEL_CHARS = 120
#: Label sets whose series keys a process keeps encoded (``MetricsRecorder``).
MAX_CACHED_SERIES = 4096


def reason_label(result: SkillResult) -> str:
    """The ``reason`` label of a finished invocation: one of ``REASONS``, "other" or ""."""
    if result.error is None:
        return ""
    reason = (result.error.details or {}).get("reason")
    if reason is None:
        return ""
    return reason if isinstance(reason, str) and reason in REASONS else OTHER_REASON


def _capped(skill: str, tool: str) -> tuple[str, str]:
    return skill[:MAX_LABEL_CHARS], tool[:MAX_LABEL_CHARS]


def zero_counts(tools: Iterable[tuple[str, str]]) -> MetricCounts:
    """Counts of zero for every ``ZERO_SERIES`` and both histograms of each (skill, tool)."""
    counts = MetricCounts()
    for skill, tool in tools:
        skill, tool = _capped(skill, tool)
        for outcome, error, reason in ZERO_SERIES:
            counts.invocations[json.dumps([skill, tool, outcome, error, reason])] += 0
        for outcome in OUTCOMES:
            counts.sums[json.dumps([skill, tool, outcome])] = 0.0
    return counts


class MetricsRecorder:
    """In-process counters of one worker process, flushed to a metric store in the background.

    One flusher thread per process adds the counts to the store every ``FLUSH_S``,
    and at once when asked (``start``, ``close``). A forked child starts with no
    counts (its parent flushes its own) and its own flusher, at its first use.
    """

    def __init__(self, store: MetricStore, known: KnownTool | None = None) -> None:
        self.store = store
        self._known = known
        #: The three series keys of each label set seen (names as sent, outcome, error,
        #: reason, bucket): JSON-encoding them was most of a quick invocation's count.
        self._keys: dict[tuple[str, ...], tuple[str, str, str]] = {}
        self._pid = -1
        self._own_process()

    def _own_process(self) -> None:
        # Locks, counts and the flusher thread belong to one process: after a fork, the
        # child's copies may hold counts its parent flushes, or a lock a thread held.
        if self._pid == os.getpid():
            return
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._flushing = threading.Lock()  # one flush at a time: the last waits for the one running
        self._counts = MetricCounts()
        self._flusher: threading.Thread | None = None
        # Flushes asked for and flushes done, under ``_asking``: ``close`` asks and waits.
        self._asking = threading.Condition(threading.Lock())
        self._asked = self._answered = 0

    def record(self, result: SkillResult) -> None:
        """Count one finished invocation."""
        self._own_process()
        error = result.error.error_type if result.error is not None else ""
        outcome = "success" if result.success else "failure"
        seconds = max(0.0, result.duration_ms / 1000)
        bucket = next((b for b in BUCKETS if seconds <= b), "+Inf")
        labels = (result.skill_name, result.tool_name, outcome, str(error), reason_label(result))
        key, series, duration = self._series(labels, str(bucket))
        with self._lock:
            counts = self._counts
            counts.invocations[key] += 1
            counts.durations[duration] += 1
            counts.sums[series] = counts.sums.get(series, 0.0) + seconds
        self._ensure_flusher()

    def record_wait(self, skill: str, tool: str, seconds: float) -> None:
        """Count an invocation sent back to wait ``seconds`` for its tool's limits."""
        self._own_process()
        shown_skill, shown_tool = self._labels(skill, tool)
        with self._lock:
            counts = self._counts
            counts.invocations[json.dumps([WAITS_LABEL, shown_skill, shown_tool])] += 1
            counts.invocations[json.dumps([WAITED_MS_LABEL, shown_skill, shown_tool])] += max(
                0, round(seconds * 1000)
            )
        self._ensure_flusher()

    def record_approval(self, skill: str, tool: str, outcome: str) -> None:
        """Count an invocation parked for approval, or settled (approved, rejected, expired)."""
        if outcome not in APPROVAL_OUTCOMES:
            return
        self._own_process()
        shown_skill, shown_tool = self._labels(skill, tool)
        with self._lock:
            key = json.dumps([APPROVALS_LABEL, shown_skill, shown_tool, outcome])
            self._counts.invocations[key] += 1
        self._ensure_flusher()

    def record_decision(self, channel: str, outcome: str) -> None:
        """Count a person's decision (approved, rejected) by the channel it came by."""
        if outcome not in ("approved", "rejected") or not channel:
            return
        self._own_process()
        with self._lock:
            self._counts.invocations[json.dumps([DECISIONS_LABEL, channel[:20], outcome])] += 1
        self._ensure_flusher()

    def _series(self, labels: tuple[str, str, str, str, str], bucket: str) -> tuple[str, str, str]:
        """The invocation, sum and duration-bucket series keys of ``labels`` and ``bucket``."""
        cached = self._keys.get((*labels, bucket))
        if cached is not None:
            return cached
        if len(self._keys) >= MAX_CACHED_SERIES:  # names a producer made up: start afresh
            self._keys.clear()
        name, tool_name, outcome, error, reason = labels
        skill, tool = self._labels(name, tool_name)
        keys = (
            json.dumps([skill, tool, outcome, error, reason]),
            json.dumps([skill, tool, outcome]),
            json.dumps([skill, tool, outcome, bucket]),
        )
        self._keys[(*labels, bucket)] = keys
        return keys

    def start(self, tools: Iterable[tuple[str, str]] = ()) -> bool:
        """Start the series of ``tools`` at zero: flushed now, waiting at most ``CLOSE_WAIT_S``."""
        self._own_process()
        zeros = zero_counts(tools)
        with self._lock:
            self._counts.add(zeros)
        self._ensure_flusher()
        return self._flush_within(CLOSE_WAIT_S)

    def _labels(self, skill: str, tool: str) -> tuple[str, str]:
        # A producer names any skill it likes: only the catalogue's names become series
        # (a bounded set), the rest count as "unknown"; every label is length-capped.
        if self._known is not None and not self._known(skill, tool):
            return UNKNOWN_LABEL, UNKNOWN_LABEL
        return _capped(skill, tool)

    def _ensure_flusher(self) -> None:
        if self._flusher is None:
            self._flusher = threading.Thread(target=self._loop, name="metrics-flush", daemon=True)
            self._flusher.start()

    def _loop(self) -> None:
        while True:
            with self._asking:
                self._asking.wait_for(lambda: self._asked > self._answered, timeout=FLUSH_S)
                asked = self._asked
            try:
                self.flush()
            except Exception:  # the store is away: keep counting, flush later
                time.sleep(FLUSH_S)
                continue
            with self._asking:
                self._answered = max(self._answered, asked)
                self._asking.notify_all()

    def flush(self) -> None:
        """Add the counts so far to the store and start counting afresh."""
        self._own_process()
        with self._flushing:
            with self._lock:
                counts, self._counts = self._counts, MetricCounts()
            if not counts:
                return
            try:
                self.store.add(counts)
            except Exception:
                with self._lock:  # put them back for the next flush
                    self._counts.add(counts)
                raise

    def close(self, wait_s: float = CLOSE_WAIT_S) -> bool:
        """Flush what is pending, as a process exits: wait at most ``wait_s`` for the store.

        Safe in a signal handler: it starts no thread, and gives up after ``wait_s``
        even if the interrupted code holds a lock. Returns False (and logs how many
        invocations went uncounted) when the counts did not reach the store in time.
        """
        self._own_process()
        if self._flush_within(wait_s):
            return True
        if self._lock.acquire(timeout=0.1):
            try:
                lost = sum(self._counts.invocations.values())
            finally:
                self._lock.release()
            if lost:
                log.warning("%d finished invocations were not counted: metric store away", lost)
        return False

    def _flush_within(self, wait_s: float) -> bool:
        # The flusher thread does it, so that a store that retries for minutes holds up
        # neither a process's exit nor a worker's start.
        if self._flusher is None:
            return True  # nothing was ever counted in this process
        with self._asking:
            self._asked += 1
            asked = self._asked
            self._asking.notify_all()
            return self._asking.wait_for(lambda: self._answered >= asked, timeout=wait_s)
