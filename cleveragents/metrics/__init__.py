"""Metrics beyond Flower's own, for Prometheus: recorded by workers, served by an exporter.

``recorder``: each worker process's counters and duration histograms, flushed to
the metric store (what workers import). ``exporter``: what ``cleveragents
metrics`` serves, read from that store and the broker's queues at each scrape
(it imports ``prometheus_client``, which a worker never loads: its names are
looked up here only when asked for).
"""

from __future__ import annotations

import importlib
from typing import Any

from cleveragents.metrics.recorder import (
    BUCKETS,
    CLOSE_WAIT_S,
    FLUSH_S,
    MAX_CACHED_SERIES,
    REASONS,
    ZERO_SERIES,
    MetricsRecorder,
    reason_label,
    zero_counts,
)

__all__ = [
    "BUCKETS",
    "CLOSE_WAIT_S",
    "FLUSH_S",
    "MAX_CACHED_SERIES",
    "QUEUES",
    "REASONS",
    "ZERO_SERIES",
    "MetricsRecorder",
    "QueueGauges",
    "RedisQueues",
    "reason_label",
    "render",
    "zero_counts",
]

#: The exporter's names, imported from ``cleveragents.metrics.exporter`` on first use.
_EXPORTER_NAMES = frozenset({"QUEUES", "QueueGauges", "RedisQueues", "render"})


def __getattr__(name: str) -> Any:
    if name in _EXPORTER_NAMES:
        return getattr(importlib.import_module("cleveragents.metrics.exporter"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
