"""One log line per invocation, as text or JSON; never arguments or outputs."""

from __future__ import annotations

import logging
import time
from typing import Any

from cleveragents.runtime.text import json_text
from cleveragents.skills import SkillResult
from cleveragents.traces.carriers import current_trace_id

__all__ = ["INVOCATION_LOGGER", "JsonFormatter", "invocation_fields", "log_invocation"]

#: The logger of the per-invocation lines.
INVOCATION_LOGGER = logging.getLogger("cleveragents.invocations")


def invocation_fields(request_id: str, result: SkillResult) -> dict[str, Any]:
    """What one invocation's line holds: who, what, how it ended, how long it took."""
    error = result.error
    fields: dict[str, Any] = {
        "request_id": request_id,
        "skill": result.skill_name,
        "tool": result.tool_name,
        "outcome": "success" if result.success else "failure",
        "error_type": str(error.error_type) if error is not None else None,
        "duration_ms": round(result.duration_ms, 3),
    }
    reason = error.details.get("reason") if error is not None else None
    if isinstance(reason, str):  # a refusal's or a limit's name: request_id_reused, poison_message
        fields["reason"] = reason[:64]
    trace_id = current_trace_id()
    if trace_id is not None:  # jump from the line to the trace
        fields["trace_id"] = trace_id
    return fields


def log_invocation(request_id: str, result: SkillResult) -> None:
    """Log one line for a finished invocation (at INFO; a failure at WARNING)."""
    level = logging.INFO if result.success else logging.WARNING
    if not INVOCATION_LOGGER.isEnabledFor(level):
        return
    fields = invocation_fields(request_id, result)
    text = " ".join(f"{k}={'-' if v is None else v}" for k, v in fields.items())
    INVOCATION_LOGGER.log(level, "invocation %s", text, extra={"invocation": fields})


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and an invocation's fields."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "process": record.processName,
            "message": record.getMessage(),
        }
        invocation = getattr(record, "invocation", None)
        if isinstance(invocation, dict):
            data.update(invocation)
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json_text(data, default=str)
