"""What a worker reports of each finished invocation: one log line and the metrics."""

from __future__ import annotations

from cleveragents.logs import log_invocation
from cleveragents.metrics import MetricsRecorder
from cleveragents.skills import SkillResult
from cleveragents.stores import MetricStore

__all__ = ["WorkerObserver"]


class WorkerObserver:
    """The pipeline's observer in a worker process: logs each invocation's line and counts it."""

    def __init__(self, metrics: MetricStore) -> None:
        self.recorder = MetricsRecorder(metrics)

    def __call__(self, request_id: str, result: SkillResult) -> None:
        log_invocation(request_id, result)
        self.recorder.record(result)
