"""What a worker reports of each finished invocation: one log line and the metrics."""

from __future__ import annotations

from typing import Any

from cleveragents.logs import log_invocation
from cleveragents.metrics import MetricsRecorder
from cleveragents.skills import SkillResult

__all__ = ["observe"]

_recorders: dict[int, MetricsRecorder] = {}


def _recorder(backend: Any) -> MetricsRecorder:
    found = _recorders.get(id(backend))
    if found is None:
        client = getattr(backend, "client", None)  # metrics need Redis; none on the embedded
        found = MetricsRecorder(client if hasattr(client, "pipeline") else None)
        _recorders[id(backend)] = found
    return found


def observe(backend: Any, request_id: str, result: SkillResult) -> None:
    """Log the invocation's line and count it."""
    log_invocation(request_id, result)
    _recorder(backend).record(result)
