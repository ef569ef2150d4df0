"""Metrics beyond Flower's own, in the Prometheus text format.

Workers count invocations by skill, tool, outcome, error type and failure reason,
and their durations in histogram buckets by skill, tool and outcome, in memory,
and add them to their metric store every ``FLUSH_S`` (one pipeline per process
with Redis, not a round trip per invocation; the embedded default drops them).
A process that exits flushes what is pending (``MetricsRecorder.close``); one
that is killed outright loses at most its last ``FLUSH_S`` of counts. A worker
starts every catalogue tool's series at zero (``MetricsRecorder.start``), so the
first invocation of a tool is an increase that ``increase()`` and ``rate()`` see.
The ``cleveragents metrics`` exporter reads those, plus the length of every queue
and the age of its oldest waiting message (``QueueGauges``: Redis lists, or RabbitMQ
queues, whose ages cannot be read: ``cleveragents.broker.rabbitmq``), and serves them at
``/metrics``.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from redis import RedisError

from cleveragents.constants import (
    QUEUE_BATCH,
    QUEUE_BATCH_WRITE,
    QUEUE_READ,
    QUEUE_WRITE,
    SENT_AT_HEADER,
)
from cleveragents.skills import SkillResult
from cleveragents.stores import MetricCounts, MetricStore, RedisMetricStore
from cleveragents.stores.redis_capacity import read_memory

__all__ = [
    "BUCKETS",
    "CLOSE_WAIT_S",
    "FLUSH_S",
    "MAX_CACHED_SERIES",
    "REASONS",
    "ZERO_SERIES",
    "MetricsRecorder",
    "QueueGauges",
    "RedisQueues",
    "reason_label",
    "render",
    "zero_counts",
]

log = logging.getLogger("cleveragents.metrics")

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
#: The queues whose length and oldest age are exported.
QUEUES = (QUEUE_READ, QUEUE_WRITE, QUEUE_BATCH, QUEUE_BATCH_WRITE)

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
_WAITS = "limit_wait"
_WAITED_MS = "limit_wait_ms"
#: First label of the fields that count approvals (skill, tool, outcome: four labels).
_APPROVALS = "approval"
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
            counts.invocations[json.dumps([_WAITS, shown_skill, shown_tool])] += 1
            counts.invocations[json.dumps([_WAITED_MS, shown_skill, shown_tool])] += max(
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
            key = json.dumps([_APPROVALS, shown_skill, shown_tool, outcome])
            self._counts.invocations[key] += 1
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


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(**labels: str) -> str:
    return "{" + ",".join(f'{k}="{_label(v)}"' for k, v in labels.items()) + "}"


class QueueGauges(Protocol):
    """What the broker tells of its queues: one implementation per broker kind."""

    def lengths(self) -> dict[str, int]:
        """Messages waiting in each queue."""
        ...

    def oldest_ages(self, now: float) -> dict[str, float]:
        """Seconds the oldest waiting message of each queue has waited, where it is known."""
        ...


class RedisQueues:
    """The skill queues of kombu's Redis transport: one Redis list each."""

    def __init__(self, redis: Any) -> None:
        self.redis = redis

    def lengths(self) -> dict[str, int]:
        """``LLEN`` of each queue."""
        return {q: int(self.redis.llen(q)) for q in QUEUES}

    def oldest_ages(self, now: float) -> dict[str, float]:
        """The age of each queue's tail message, from the header its producer set."""
        return {q: _oldest_age(self.redis, q, now) for q in QUEUES}


def _oldest_age(redis: Any, queue: str, now: float) -> float:
    raw = redis.lindex(queue, -1)  # LPUSH in, BRPOP out: the oldest is at the tail
    if raw is None:
        return 0.0
    try:
        sent = float(json.loads(raw)["headers"][SENT_AT_HEADER])
    except (ValueError, KeyError, TypeError):
        return 0.0
    return max(0.0, now - sent)


def _fields(raw: str, arity: int) -> list[str] | None:
    # A field written by another release (fewer labels, other buckets) is skipped.
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(value, list) or len(value) != arity:
        return None
    return [str(v) for v in value]


def render(redis: Any, queues: QueueGauges | None = None) -> str:
    """Every metric, in the Prometheus text exposition format.

    ``redis`` holds the invocation counters; ``queues`` reads the broker's queues (by
    default the Redis lists of ``redis``). A queue whose oldest age is not known has
    no age sample: none at all is better than a 0 that looks like an empty queue.
    """
    queues = RedisQueues(redis) if queues is None else queues
    now = time.time()
    lines = [
        "# HELP cleveragents_queue_length Messages waiting in a queue (a batch chunk counts once).",
        "# TYPE cleveragents_queue_length gauge",
    ]
    lengths = queues.lengths()
    lines += [f"cleveragents_queue_length{_labels(queue=q)} {n}" for q, n in lengths.items()]
    lines += [
        "# HELP cleveragents_queue_oldest_age_seconds Age of the oldest waiting message.",
        "# TYPE cleveragents_queue_oldest_age_seconds gauge",
    ]
    lines += [
        f"cleveragents_queue_oldest_age_seconds{_labels(queue=q)} {age:.3f}"
        for q, age in queues.oldest_ages(now).items()
    ]
    counts = RedisMetricStore(redis).totals()
    lines += _invocations(counts)
    lines += _histogram(counts)
    lines += _waits(counts)
    lines += _approvals(counts, redis, now)
    lines += _redis_memory(redis)
    return "\n".join(lines) + "\n"


def _redis_memory(redis: Any) -> list[str]:
    """The results' Redis: memory used, its maxmemory, whether its policy evicts
    (none when its user may not run INFO)."""
    try:
        memory = read_memory(redis)
    except RedisError:
        return []
    return [
        "# HELP cleveragents_redis_used_memory_bytes Memory the Redis of results and metrics "
        "uses (INFO memory used_memory).",
        "# TYPE cleveragents_redis_used_memory_bytes gauge",
        f"cleveragents_redis_used_memory_bytes {memory.used_bytes}",
        "# HELP cleveragents_redis_maxmemory_bytes Its maxmemory (0: no limit).",
        "# TYPE cleveragents_redis_maxmemory_bytes gauge",
        f"cleveragents_redis_maxmemory_bytes {memory.max_bytes}",
        "# HELP cleveragents_redis_evicting 1 when its maxmemory-policy evicts keys (workers "
        "refuse it unless CLEVERAGENTS_ALLOW_EVICTION is set).",
        "# TYPE cleveragents_redis_evicting gauge",
        f"cleveragents_redis_evicting{_labels(policy=memory.policy)} {int(memory.evicts)}",
    ]


def _approvals(counts: MetricCounts, redis: Any, now: float) -> list[str]:
    """Approvals by outcome, and how long the oldest parked invocation has waited."""
    found: Counter[tuple[str, str, str]] = Counter()
    for field, count in counts.invocations.items():
        names = _fields(field, 4)
        if names is not None and names[0] == _APPROVALS:
            found[(names[1], names[2], names[3])] += int(count)
    lines = [
        "# HELP cleveragents_approvals_oldest_waiting_seconds How long the invocation waiting "
        "longest for a person's approval has waited (0: none waits).",
        "# TYPE cleveragents_approvals_oldest_waiting_seconds gauge",
        f"cleveragents_approvals_oldest_waiting_seconds {_oldest_parked_s(redis, now):.3f}",
    ]
    if not found:
        return lines
    lines += [
        "# HELP cleveragents_approvals_total Invocations parked for approval, and how each "
        "ended: approved, rejected, expired.",
        "# TYPE cleveragents_approvals_total counter",
    ]
    for (skill, tool, outcome), count in sorted(found.items()):
        text = _labels(skill=skill, tool=tool, outcome=outcome)
        lines.append(f"cleveragents_approvals_total{text} {count}")
    return lines


def _oldest_parked_s(redis: Any, now: float) -> float:
    from cleveragents.stores.approvals_redis import RedisApprovalStore  # the exporter's only

    oldest = RedisApprovalStore(redis, 0).oldest_asked_at()  # both fleets' indexes
    return max(0.0, now - oldest) if oldest is not None else 0.0


def _waits(counts: MetricCounts) -> list[str]:
    waits: Counter[tuple[str, str]] = Counter()
    waited_ms: Counter[tuple[str, str]] = Counter()
    for field, count in counts.invocations.items():
        names = _fields(field, 3)
        if names is not None and names[0] in (_WAITS, _WAITED_MS):
            (waits if names[0] == _WAITS else waited_ms)[(names[1], names[2])] += int(count)
    if not waits:
        return []
    lines = [
        "# HELP cleveragents_limit_waits_total Invocations sent back to wait for a tool's limits.",
        "# TYPE cleveragents_limit_waits_total counter",
    ]
    for (skill, tool), count in sorted(waits.items()):
        lines.append(f"cleveragents_limit_waits_total{_labels(skill=skill, tool=tool)} {count}")
    lines += [
        "# HELP cleveragents_limit_wait_seconds_total Time invocations were sent back to wait "
        "for a tool's limits.",
        "# TYPE cleveragents_limit_wait_seconds_total counter",
    ]
    for (skill, tool), ms in sorted(waited_ms.items()):
        text = _labels(skill=skill, tool=tool)
        lines.append(f"cleveragents_limit_wait_seconds_total{text} {ms / 1000:.3f}")
    return lines


def _invocations(counts: MetricCounts) -> list[str]:
    series: Counter[tuple[str, ...]] = Counter()
    for field, count in counts.invocations.items():
        names = _fields(field, 5)
        if names is None:
            old = _fields(field, 4)  # counted before the reason label: reason ""
            names = None if old is None else [*old, ""]
        if names is not None:
            series[tuple(names)] += int(count)
    lines = [
        "# HELP cleveragents_invocations_total Finished invocations.",
        "# TYPE cleveragents_invocations_total counter",
    ]
    for (skill, tool, outcome, error, reason), count in sorted(series.items()):
        text = _labels(skill=skill, tool=tool, outcome=outcome, error_type=error, reason=reason)
        lines.append(f"cleveragents_invocations_total{text} {count}")
    return lines


def _histogram(counts: MetricCounts) -> list[str]:
    buckets: dict[tuple[str, ...], Counter[str]] = {}
    sums: dict[tuple[str, ...], float] = {}
    for field, total in counts.sums.items():
        names = _fields(field, 3)
        if names is not None:
            sums[tuple(names)] = total
            buckets.setdefault(tuple(names), Counter())
    for field, value in counts.durations.items():
        names = _fields(field, 4)
        if names is not None:
            buckets.setdefault(tuple(names[:3]), Counter())[names[3]] += int(value)
    lines = [
        "# HELP cleveragents_invocation_duration_seconds Time an invocation took in the runtime.",
        "# TYPE cleveragents_invocation_duration_seconds histogram",
    ]
    for (skill, tool, outcome), per_bucket in sorted(buckets.items()):
        running = 0
        for bound in [*(str(b) for b in BUCKETS), "+Inf"]:
            running += per_bucket.get(bound, 0)
            text = _labels(skill=skill, tool=tool, outcome=outcome, le=bound)
            lines.append(f"cleveragents_invocation_duration_seconds_bucket{text} {running}")
        text = _labels(skill=skill, tool=tool, outcome=outcome)
        total = sums.get((skill, tool, outcome), 0.0)
        lines.append(f"cleveragents_invocation_duration_seconds_sum{text} {total:.6f}")
        lines.append(f"cleveragents_invocation_duration_seconds_count{text} {running}")
    return lines
