"""The seven error categories of the skill protocol."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["SkillErrorType"]


class SkillErrorType(StrEnum):
    """Every category a ``SkillError`` can carry."""

    SKILL_NOT_FOUND = "skill_not_found"
    RESOLUTION_FAILURE = "resolution_failure"
    CYCLE_DETECTED = "cycle_detected"
    TOOL_ACTIVATION_FAILURE = "tool_activation_failure"
    TOOL_EXECUTION_FAILURE = "tool_execution_failure"
    VALIDATION_ERROR = "validation_error"
    PERMISSION_DENIED = "permission_denied"
