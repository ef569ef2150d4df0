"""The skill protocol: error types, errors, metadata, definitions, results.

These are the types of ``skill-protocol.md``, frozen pydantic models, plus
``map_tool_error``, which turns any exception into a ``SkillError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from cleveragents.errors import SkillErrorType
from cleveragents.skills.model import (
    ResolvedToolEntry,
    Skill,
    SkillCapabilitySummary,
    ToolSpec,
)

__all__ = [
    "SkillDefinition",
    "SkillError",
    "SkillErrorType",
    "SkillMetadata",
    "SkillResult",
    "map_tool_error",
]

_FROZEN = ConfigDict(frozen=True)


class SkillError(BaseModel):
    """Structured error payload for skill operations."""

    model_config = _FROZEN

    error_type: SkillErrorType
    message: str
    details: dict[str, Any] = Field(default_factory=dict)
    skill_name: str
    tool_name: str | None = None


class SkillMetadata(BaseModel):
    """Lightweight metadata for skill discovery and catalogue listings."""

    model_config = _FROZEN

    name: str
    description: str
    version: str = "0.0.0"
    tool_count: int = 0
    capability_summary: SkillCapabilitySummary = Field(default_factory=SkillCapabilitySummary)
    source_types: list[str] = Field(default_factory=list)
    writes: bool = False
    read_only: bool = True

    @classmethod
    def from_skill(
        cls,
        skill: Skill,
        *,
        resolved: Sequence[ResolvedToolEntry] | None = None,
        version: str | None = None,
    ) -> SkillMetadata:
        """Derive metadata from a skill and its resolved tools (its own tools if not given)."""
        tools: list[ToolSpec] = (
            [entry.tool for entry in resolved] if resolved is not None else list(skill.tools)
        )
        summary = SkillCapabilitySummary.of(tools)
        writes = summary.write_tools > 0 or summary.has_side_effects
        return cls(
            name=skill.name,
            description=skill.description,
            version=version if version is not None else skill.version,
            tool_count=len(tools),
            capability_summary=summary,
            source_types=sorted({t.source for t in tools}),
            writes=writes,
            read_only=summary.write_tools == 0 and not summary.has_side_effects,
        )


def _check_schema(value: dict[str, Any] | None, which: str) -> dict[str, Any] | None:
    if value is not None and "type" not in value:
        raise ValueError(f"{which} must include a 'type' key to be a JSON Schema object")
    return value


class SkillDefinition(BaseModel):
    """A skill with its flattened tools and pre-computed metadata."""

    model_config = _FROZEN

    skill: Skill
    resolved_tools: list[ResolvedToolEntry] = Field(default_factory=list)
    metadata: SkillMetadata
    input_schema: dict[str, Any] | None = None
    output_schema: dict[str, Any] | None = None

    @field_validator("input_schema")
    @classmethod
    def _input_schema_typed(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return _check_schema(value, "input_schema")

    @field_validator("output_schema")
    @classmethod
    def _output_schema_typed(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return _check_schema(value, "output_schema")

    @model_validator(mode="after")
    def _writes_consistent(self) -> SkillDefinition:
        if self.metadata.read_only:
            writers = [e.tool.name for e in self.resolved_tools if e.tool.write_capable]
            if writers:
                raise ValueError(
                    f"skill {self.skill.name!r} is read-only but reaches write-capable "
                    f"tools: {', '.join(writers)}"
                )
        return self


class SkillResult(BaseModel):
    """Outcome of a single skill-tool invocation."""

    model_config = _FROZEN

    skill_name: str
    tool_name: str
    success: bool
    output_data: Any = None
    error: SkillError | None = None
    duration_ms: float = 0.0
    resource_changes: list[dict[str, Any]] = Field(default_factory=list)


def _error_type_of(exc: BaseException) -> SkillErrorType:
    declared = getattr(exc, "error_type", None)
    if declared is not None:
        try:
            return SkillErrorType(declared)
        except ValueError:
            pass  # not one of ours: fall back to the seed's rules
    message = str(exc).lower()
    if isinstance(exc, ValidationError):
        return SkillErrorType.VALIDATION_ERROR
    if isinstance(exc, ValueError):
        if "cycle" in message:
            return SkillErrorType.CYCLE_DETECTED
        if "not found" in message:
            return SkillErrorType.SKILL_NOT_FOUND
        return SkillErrorType.RESOLUTION_FAILURE
    if isinstance(exc, PermissionError):
        return SkillErrorType.PERMISSION_DENIED
    if "activation" in message:
        return SkillErrorType.TOOL_ACTIVATION_FAILURE
    return SkillErrorType.TOOL_EXECUTION_FAILURE


def map_tool_error(
    exc: BaseException, *, skill_name: str, tool_name: str | None = None
) -> SkillError:
    """Normalise any exception into a ``SkillError``.

    A library error's own ``error_type`` wins; every other exception follows the
    seed's table (pydantic ``ValidationError`` before ``ValueError``; message
    matching is case-insensitive). The message is ``str(exc)``, never a traceback.
    """
    details: dict[str, Any] = {}
    extra = getattr(exc, "details", None)
    if isinstance(extra, dict):
        details.update(extra)
    details["exception_type"] = type(exc).__name__
    message = str(exc) or type(exc).__name__
    return SkillError(
        error_type=_error_type_of(exc),
        message=message,
        details=details,
        skill_name=skill_name,
        tool_name=tool_name,
    )
