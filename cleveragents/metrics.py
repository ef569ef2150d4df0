"""Metrics beyond Flower's own, in the Prometheus text format.

Workers count invocations by skill, tool, outcome and error type, and their
durations in histogram buckets, in memory, and add them to their metric store
every ``FLUSH_S`` (one pipeline per process with Redis, not a round trip per
invocation; the embedded default drops them). The ``cleveragents metrics``
exporter reads those, plus the length of every queue and the age of its oldest
waiting message, and serves them at ``/metrics``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from cleveragents.constants import (
    QUEUE_BATCH,
    QUEUE_BATCH_WRITE,
    QUEUE_READ,
    QUEUE_WRITE,
    SENT_AT_HEADER,
)
from cleveragents.skills import SkillResult
from cleveragents.stores import MetricCounts, MetricStore, RedisMetricStore

__all__ = ["BUCKETS", "FLUSH_S", "MetricsRecorder", "render"]

#: Histogram buckets of invocation durations, in seconds.
BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0, 300.0)
#: Seconds between two flushes of a process's counters to its metric store.
FLUSH_S = 2.0
QUEUES = (QUEUE_READ, QUEUE_WRITE, QUEUE_BATCH, QUEUE_BATCH_WRITE)


#: What ``known(skill, tool)`` answers: whether the names are the catalogue's.
KnownTool = Callable[[str, str], bool]
#: The label of invocations naming a skill or tool the catalogue does not have.
UNKNOWN_LABEL = "unknown"
#: Longest label value kept.
MAX_LABEL_CHARS = 120


class MetricsRecorder:
    """In-process counters of one worker process, flushed to a metric store in the background."""

    def __init__(self, store: MetricStore, known: KnownTool | None = None) -> None:
        self.store = store
        self._known = known
        self._lock = threading.Lock()
        self._counts = MetricCounts()
        self._pid = 0

    def record(self, result: SkillResult) -> None:
        """Count one finished invocation."""
        error = result.error.error_type if result.error is not None else ""
        outcome = "success" if result.success else "failure"
        skill, tool_name = self._labels(result.skill_name, result.tool_name)
        key = json.dumps([skill, tool_name, outcome, str(error)])
        seconds = result.duration_ms / 1000
        tool = json.dumps([skill, tool_name])
        bucket = next((b for b in BUCKETS if seconds <= b), "+Inf")
        with self._lock:
            counts = self._counts
            counts.invocations[key] += 1
            counts.durations[json.dumps([skill, tool_name, str(bucket)])] += 1
            counts.sums[tool] = counts.sums.get(tool, 0.0) + seconds
        self._ensure_flusher()

    def _labels(self, skill: str, tool: str) -> tuple[str, str]:
        # A producer names any skill it likes: only the catalogue's names become series
        # (a bounded set), the rest count as "unknown"; every label is length-capped.
        if self._known is not None and not self._known(skill, tool):
            return UNKNOWN_LABEL, UNKNOWN_LABEL
        return skill[:MAX_LABEL_CHARS], tool[:MAX_LABEL_CHARS]

    def _ensure_flusher(self) -> None:
        if self._pid == os.getpid():
            return
        self._pid = os.getpid()  # once per process (a forked pool child starts its own)
        threading.Thread(target=self._loop, name="metrics-flush", daemon=True).start()

    def _loop(self) -> None:
        while True:
            time.sleep(FLUSH_S)
            try:
                self.flush()
            except Exception:  # the store is away: keep counting, flush later
                continue

    def flush(self) -> None:
        """Add the counts so far to the store and start counting afresh."""
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


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(**labels: str) -> str:
    return "{" + ",".join(f'{k}="{_label(v)}"' for k, v in labels.items()) + "}"


def _oldest_age(redis: Any, queue: str, now: float) -> float:
    raw = redis.lindex(queue, -1)  # LPUSH in, BRPOP out: the oldest is at the tail
    if raw is None:
        return 0.0
    try:
        sent = float(json.loads(raw)["headers"][SENT_AT_HEADER])
    except (ValueError, KeyError, TypeError):
        return 0.0
    return max(0.0, now - sent)


def render(redis: Any) -> str:
    """Every metric, in the Prometheus text exposition format."""
    now = time.time()
    lines = [
        "# HELP cleveragents_queue_length Messages waiting in a queue (a batch chunk counts once).",
        "# TYPE cleveragents_queue_length gauge",
    ]
    lengths = {q: int(redis.llen(q)) for q in QUEUES}
    lines += [f"cleveragents_queue_length{_labels(queue=q)} {n}" for q, n in lengths.items()]
    lines += [
        "# HELP cleveragents_queue_oldest_age_seconds Age of the oldest waiting message.",
        "# TYPE cleveragents_queue_oldest_age_seconds gauge",
    ]
    lines += [
        f"cleveragents_queue_oldest_age_seconds{_labels(queue=q)} {_oldest_age(redis, q, now):.3f}"
        for q in QUEUES
    ]
    lines += [
        "# HELP cleveragents_invocations_total Finished invocations.",
        "# TYPE cleveragents_invocations_total counter",
    ]
    counts = RedisMetricStore(redis).totals()
    for field, count in sorted(counts.invocations.items()):
        skill, tool, outcome, error = json.loads(field)
        lines.append(
            f"cleveragents_invocations_total"
            f"{_labels(skill=skill, tool=tool, outcome=outcome, error_type=error)} {int(count)}"
        )
    lines += _histogram(counts)
    return "\n".join(lines) + "\n"


def _histogram(counts: MetricCounts) -> list[str]:
    buckets: dict[tuple[str, str], Counter[str]] = {}
    sums: dict[tuple[str, str], float] = {}
    for field, total in counts.sums.items():
        skill, tool = json.loads(field)
        sums[(skill, tool)] = total
    for field, value in counts.durations.items():
        skill, tool, bucket = json.loads(field)
        buckets.setdefault((skill, tool), Counter())[bucket] += int(value)
    lines = [
        "# HELP cleveragents_invocation_duration_seconds Time an invocation took in the runtime.",
        "# TYPE cleveragents_invocation_duration_seconds histogram",
    ]
    for (skill, tool), per_bucket in sorted(buckets.items()):
        running = 0
        for bound in [*(str(b) for b in BUCKETS), "+Inf"]:
            running += per_bucket.get(bound, 0)
            lines.append(
                f"cleveragents_invocation_duration_seconds_bucket"
                f"{_labels(skill=skill, tool=tool, le=bound)} {running}"
            )
        lines.append(
            f"cleveragents_invocation_duration_seconds_sum{_labels(skill=skill, tool=tool)} "
            f"{sums.get((skill, tool), 0.0):.6f}"
        )
        lines.append(
            f"cleveragents_invocation_duration_seconds_count{_labels(skill=skill, tool=tool)} "
            f"{running}"
        )
    return lines
