"""One way to build a failed ``SkillResult``, and one way to read names from an untrusted body.

Every place that answers with a failure (the runtime, the guard, the consumer,
the batch runner, the wire decoder) builds it here, so that the result's
``skill_name``/``tool_name`` and the error's agree, and a producer's body is
read the same way everywhere: a field that is not a string counts as ``""``.
Text a failure echoes (a producer's names, a tool's message) that UTF-8 cannot
hold has its lone surrogates replaced (``runtime/text.py``), so that every result can be
stored, logged and written. And a failure is small whatever a tool raised: its message
is cut past ``MAX_MESSAGE_CHARS``, its details past ``MAX_DETAILS_CHARS`` of JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from cleveragents.errors import SkillErrorType
from cleveragents.runtime.text import holds_lone_surrogate, writable, writable_value
from cleveragents.skills.protocol import SkillError, SkillResult

__all__ = [
    "MAX_DETAILS_CHARS",
    "MAX_MESSAGE_CHARS",
    "UNKNOWN_WRITE_ADVICE",
    "WRITE_NOT_STARTED",
    "WRITE_UNKNOWN",
    "failed_result",
    "failed_with",
    "names_of",
    "text_field",
    "with_write_outcome",
]

#: ``error.details["write_outcome"]`` of a failed write whose tool never started (a gate,
#: validation, activation, a rejection): the write did not happen.
WRITE_NOT_STARTED = "not_started"
#: ... of a failed write whose tool started (it failed, timed out, was stopped or lost
#: before it reported back): its effect may have happened.
WRITE_UNKNOWN = "unknown"
#: What a caller should do about a write whose outcome is unknown (in its message and the
#: CLI's ``fix:`` line).
UNKNOWN_WRITE_ADVICE = (
    "the write may have happened: check before you send it again; sending it again "
    "under the same request id is safe"
)

#: The longest message a failure keeps, in characters (a python tool may raise with
#: megabytes of text; the stored result holds the message more than once).
MAX_MESSAGE_CHARS = 10_000
#: The most characters of JSON a failure's details keep.
MAX_DETAILS_CHARS = 10_000
#: How much of one string a failure's details keep when they are cut.
_DETAIL_CHARS = 1_000


def text_field(body: Any, name: str) -> str:
    """``body[name]`` when ``body`` is a mapping and the value a string, else ``""``."""
    value = body.get(name) if isinstance(body, Mapping) else None
    return value if isinstance(value, str) else ""


def names_of(body: Any) -> tuple[str, str]:
    """The skill and tool names an untrusted request body carries (``""`` where absent)."""
    return text_field(body, "skill"), text_field(body, "tool")


def _cut(text: str, keep: int) -> str:
    return text if len(text) <= keep else text[:keep] + f"... ({len(text) - keep:,} more chars)"


def _json_size(value: Any) -> int:
    return len(json.dumps(value, default=str))


def _small_details(details: dict[str, Any]) -> dict[str, Any]:
    """``details`` within ``MAX_DETAILS_CHARS``: long strings cut, then what still does not
    fit dropped (``details_cut`` counts the entries dropped)."""
    if _json_size(details) <= MAX_DETAILS_CHARS:
        return details
    kept: dict[str, Any] = {}
    budget, dropped = MAX_DETAILS_CHARS - 100, 0  # room for details_cut
    for key, value in details.items():
        value = _cut(value, _DETAIL_CHARS) if isinstance(value, str) else value
        size = _json_size({key: value})
        if size > budget:
            dropped += 1
            continue
        kept[key] = value
        budget -= size
    if dropped:
        kept["details_cut"] = dropped
    return kept


def _small(error: SkillError) -> SkillError:
    message = _cut(error.message, MAX_MESSAGE_CHARS)
    details = _small_details(error.details)
    if message is error.message and details is error.details:
        return error
    return error.model_copy(update={"message": message, "details": details})


def with_write_outcome(result: SkillResult, outcome: str) -> SkillResult:
    """``result`` with ``details["write_outcome"]`` (a failure of a write-capable tool).

    An unknown outcome also says so in the message, for a person who reads only that.
    A result that already says (the first run's, read back) is returned as it is.
    """
    error = result.error
    if error is None or "write_outcome" in error.details:
        return result
    message = error.message
    if outcome == WRITE_UNKNOWN:
        message = f"{message} ({UNKNOWN_WRITE_ADVICE})"
    details = {**error.details, "write_outcome": outcome}
    said = error.model_copy(update={"message": message, "details": details})
    return result.model_copy(update={"error": said})


def failed_result(
    skill: str,
    tool: str,
    error_type: SkillErrorType,
    message: str,
    details: Mapping[str, Any] | None = None,
    *,
    duration_ms: float = 0.0,
) -> SkillResult:
    """A failed ``SkillResult`` whose error names the same skill and tool."""
    return failed_with(
        SkillError(
            error_type=error_type,
            message=message,
            details=dict(details or {}),
            skill_name=skill,
            tool_name=tool or None,
        ),
        skill,
        tool,
        duration_ms=duration_ms,
    )


def failed_with(
    error: SkillError, skill: str, tool: str, *, duration_ms: float = 0.0
) -> SkillResult:
    """A failed ``SkillResult`` carrying ``error`` (its text made writable, and cut to size)."""
    error = _small(error)
    if holds_lone_surrogate(
        (error.message, error.skill_name, error.tool_name, error.details, skill, tool)
    ):
        skill, tool = writable(skill), writable(tool)
        error = error.model_copy(
            update={
                "message": writable(error.message),
                "skill_name": writable(error.skill_name),
                "tool_name": None if error.tool_name is None else writable(error.tool_name),
                "details": writable_value(error.details),
            }
        )
    return SkillResult(
        skill_name=skill,
        tool_name=tool,
        success=False,
        error=error,
        duration_ms=duration_ms,
    )
