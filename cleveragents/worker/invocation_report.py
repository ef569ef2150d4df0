"""What a worker reports of each finished invocation: one log line and the metrics."""

from __future__ import annotations

from collections.abc import Callable

from cleveragents.approvals.model import WAITING, Resolution
from cleveragents.logs import log_invocation
from cleveragents.metrics.recorder import CLOSE_WAIT_S, MetricsRecorder
from cleveragents.skills import Catalogue, SkillResult
from cleveragents.stores import MetricStore

__all__ = ["WorkerObserver", "catalogue_tools"]


def catalogue_tools(catalogue: Catalogue) -> list[tuple[str, str]]:
    """Every (skill, tool) the catalogue serves: a tool once under each skill that reaches it."""
    return [
        (name, entry.tool.name)
        for name in catalogue.names
        for entry in catalogue.resolve(name).resolved_tools
    ]


def _known_to(catalogue: Catalogue) -> Callable[[str, str], bool]:
    # The names taken once: counting an invocation does not look its tool up in the
    # catalogue again (the runtime's lookup is the delivery's one in this process).
    served = frozenset(catalogue_tools(catalogue))
    return lambda skill, tool: (skill, tool) in served


class WorkerObserver:
    """The pipeline's observer in a worker process: logs each invocation's line and counts it."""

    def __init__(self, metrics: MetricStore, catalogue: Catalogue | None = None) -> None:
        self.catalogue = catalogue
        self.recorder = MetricsRecorder(
            metrics, None if catalogue is None else _known_to(catalogue)
        )

    def __call__(self, request_id: str, result: SkillResult) -> None:
        log_invocation(request_id, result)
        self.recorder.record(result)

    def waited(self, skill: str, tool: str, seconds: float) -> None:
        """An invocation was sent back to wait ``seconds`` for its tool's limits."""
        self.recorder.record_wait(skill, tool, seconds)

    def approval(self, resolution: Resolution) -> None:
        """An invocation parked for approval now, or settled now."""
        record = resolution.record
        outcome = "parked" if resolution.state == WAITING else resolution.state
        self.recorder.record_approval(record.skill, record.tool, outcome)
        decision = resolution.decision
        if decision is not None:  # settled now by a person: counted by how they decided
            self.recorder.record_decision(decision.channel or "unknown", decision.outcome)

    def start(self) -> None:
        """Start every catalogue tool's series at zero (once per worker, at its start)."""
        self.recorder.start([] if self.catalogue is None else catalogue_tools(self.catalogue))

    def close(self, wait_s: float = CLOSE_WAIT_S) -> bool:
        """Flush the counts still pending (as the process exits); False if the store was away."""
        return self.recorder.close(wait_s)
