"""What a worker reports of each finished invocation: one log line and the metrics."""

from __future__ import annotations

from collections.abc import Callable

from cleveragents.logs import log_invocation
from cleveragents.metrics import MetricsRecorder
from cleveragents.skills import Catalogue, SkillResult
from cleveragents.stores import MetricStore

__all__ = ["WorkerObserver"]


def _known_to(catalogue: Catalogue) -> Callable[[str, str], bool]:
    def known(skill: str, tool: str) -> bool:
        try:
            catalogue.find_tool(skill, tool)
        except Exception:  # not found, not resolvable: a name the catalogue does not serve
            return False
        return True

    return known


class WorkerObserver:
    """The pipeline's observer in a worker process: logs each invocation's line and counts it."""

    def __init__(self, metrics: MetricStore, catalogue: Catalogue | None = None) -> None:
        self.recorder = MetricsRecorder(
            metrics, None if catalogue is None else _known_to(catalogue)
        )

    def __call__(self, request_id: str, result: SkillResult) -> None:
        log_invocation(request_id, result)
        self.recorder.record(result)
