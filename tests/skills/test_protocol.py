"""The protocol types of ``skill-protocol.md`` (SPEC section 3)."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError, field_validator

from cleveragents.errors import (
    IncludeCycleError,
    ReadOnlyViolation,
    ResolutionFailure,
    SchemaValidationError,
    SkillNotFoundError,
    ToolActivationError,
    ToolExecutionError,
    WriteRefused,
)
from cleveragents.skills import (
    ResolvedToolEntry,
    Skill,
    SkillCapabilitySummary,
    SkillDefinition,
    SkillError,
    SkillErrorType,
    SkillMetadata,
    SkillResult,
    ToolSpec,
    map_tool_error,
)

# --------------------------------------------------------------------------- helpers


def _tool(name: str, *, source: str = "python", **flags: Any) -> ToolSpec:
    if source == "python":
        entrypoint = "cleveragents.examples.tools:echo"
        return ToolSpec(name=name, source="python", entrypoint=entrypoint, **flags)
    return ToolSpec(name=name, source="command", command=["python3", "-c", "pass"], **flags)


def _entries(skill_name: str, *tools: ToolSpec) -> list[ResolvedToolEntry]:
    return [ResolvedToolEntry(tool=t, source_skill=skill_name) for t in tools]


def _mapped(exc: BaseException) -> SkillErrorType:
    return map_tool_error(exc, skill_name="local/s", tool_name="local/t").error_type


class _Strict(BaseModel):
    value: int

    @field_validator("value")
    @classmethod
    def _small(cls, value: int) -> int:
        if value > 10:
            raise ValueError("cycle not found activation")  # words every other rule matches
        return value


def _pydantic_error() -> ValidationError:
    try:
        _Strict(value=11)
    except ValidationError as exc:
        return exc
    raise AssertionError("expected a ValidationError")


# --------------------------------------------------------------------------- SkillErrorType


def test_skill_error_type_is_a_str_enum_with_exactly_the_seven_values() -> None:
    assert issubclass(SkillErrorType, StrEnum)
    assert {member.value for member in SkillErrorType} == {
        "skill_not_found",
        "resolution_failure",
        "cycle_detected",
        "tool_activation_failure",
        "tool_execution_failure",
        "validation_error",
        "permission_denied",
    }
    assert len(SkillErrorType) == 7


def test_skill_error_type_members_compare_equal_to_their_text() -> None:
    text: str = SkillErrorType.CYCLE_DETECTED
    assert text == "cycle_detected"
    assert f"{SkillErrorType.PERMISSION_DENIED}" == "permission_denied"
    assert SkillErrorType("permission_denied") is SkillErrorType.PERMISSION_DENIED


def test_skill_error_type_members_cannot_be_reassigned() -> None:
    with pytest.raises(AttributeError):
        SkillErrorType.CYCLE_DETECTED = "something_else"  # type: ignore[misc]


# --------------------------------------------------------------------------- map_tool_error rows


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (ValueError("include cycle between local/a and local/b"), SkillErrorType.CYCLE_DETECTED),
        (ValueError("skill local/x not found"), SkillErrorType.SKILL_NOT_FOUND),
        (ValueError("something else went wrong"), SkillErrorType.RESOLUTION_FAILURE),
        (PermissionError("write refused"), SkillErrorType.PERMISSION_DENIED),
        (RuntimeError("tool activation failed"), SkillErrorType.TOOL_ACTIVATION_FAILURE),
        (ImportError("activation: no module named x"), SkillErrorType.TOOL_ACTIVATION_FAILURE),
        (RuntimeError("boom"), SkillErrorType.TOOL_EXECUTION_FAILURE),
        (KeyError("k"), SkillErrorType.TOOL_EXECUTION_FAILURE),
        (TimeoutError("took too long"), SkillErrorType.TOOL_EXECUTION_FAILURE),
    ],
    ids=[
        "value-error-cycle",
        "value-error-not-found",
        "value-error-other",
        "permission-error",
        "any-activation",
        "import-error-activation",
        "any-other",
        "key-error",
        "timeout",
    ],
)
def test_each_row_of_the_mapping_table(exc: BaseException, expected: SkillErrorType) -> None:
    assert _mapped(exc) is expected


def test_pydantic_validation_error_is_validation_error_although_it_is_a_value_error() -> None:
    exc = _pydantic_error()
    assert isinstance(exc, ValueError)
    # Its message says "cycle", "not found" and "activation": the type still wins.
    assert _mapped(exc) is SkillErrorType.VALIDATION_ERROR


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (ValueError("INCLUDE CYCLE"), SkillErrorType.CYCLE_DETECTED),
        (ValueError("Skill Not Found"), SkillErrorType.SKILL_NOT_FOUND),
        (RuntimeError("ACTIVATION FAILED"), SkillErrorType.TOOL_ACTIVATION_FAILURE),
    ],
)
def test_message_matching_is_case_insensitive(exc: BaseException, expected: SkillErrorType) -> None:
    assert _mapped(exc) is expected


def test_value_error_rows_come_before_the_any_rows() -> None:
    # The table is read top to bottom: a ValueError never reaches the "Any" rows.
    assert _mapped(ValueError("activation failed")) is SkillErrorType.RESOLUTION_FAILURE


def test_cycle_is_checked_before_not_found() -> None:
    assert _mapped(ValueError("cycle: local/a not found")) is SkillErrorType.CYCLE_DETECTED


def test_permission_error_ignores_its_message() -> None:
    assert _mapped(PermissionError("activation cycle")) is SkillErrorType.PERMISSION_DENIED


def test_exception_type_detail_is_the_class_name() -> None:
    class OddFailure(RuntimeError):
        pass

    error = map_tool_error(OddFailure("odd"), skill_name="local/s")
    assert error.details["exception_type"] == "OddFailure"
    assert (
        map_tool_error(_pydantic_error(), skill_name="local/s").details["exception_type"]
        == "ValidationError"
    )


def test_message_is_str_of_the_exception_without_a_traceback() -> None:
    def fail() -> None:
        raise RuntimeError("disk on fire")

    try:
        fail()
    except RuntimeError as exc:
        error = map_tool_error(exc, skill_name="local/s", tool_name="local/t")
    assert error.message == "disk on fire"
    assert "Traceback" not in error.message
    assert "Traceback" not in str(error.details)


def test_skill_and_tool_names_are_carried_into_the_error() -> None:
    error = map_tool_error(RuntimeError("x"), skill_name="local/s", tool_name="local/t")
    assert (error.skill_name, error.tool_name) == ("local/s", "local/t")
    assert map_tool_error(RuntimeError("x"), skill_name="local/s").tool_name is None


# --------------------------------------------------------------------------- library errors


def test_skill_not_found_wins_over_cycle_in_the_skill_name() -> None:
    exc = SkillNotFoundError("skill not found: ops/bicycle")
    assert _mapped(exc) is SkillErrorType.SKILL_NOT_FOUND


def test_resolution_failure_wins_over_cycle_in_the_include_name() -> None:
    exc = ResolutionFailure(
        "skill 'ops/deploy' includes 'ops/lifecycle', which is not found in the catalogue"
    )
    assert _mapped(exc) is SkillErrorType.RESOLUTION_FAILURE


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (IncludeCycleError("include cycle detected: a -> a"), SkillErrorType.CYCLE_DETECTED),
        (ReadOnlyViolation("reaches a writing tool"), SkillErrorType.VALIDATION_ERROR),
        (SchemaValidationError("cycle not found"), SkillErrorType.VALIDATION_ERROR),
        (ToolActivationError("cannot import"), SkillErrorType.TOOL_ACTIVATION_FAILURE),
        (ToolExecutionError("activation crashed"), SkillErrorType.TOOL_EXECUTION_FAILURE),
        (WriteRefused("not allowed"), SkillErrorType.PERMISSION_DENIED),
    ],
)
def test_library_errors_carry_their_own_error_type(
    exc: BaseException, expected: SkillErrorType
) -> None:
    assert _mapped(exc) is expected


def test_library_error_details_are_kept_beside_the_exception_type() -> None:
    exc = IncludeCycleError("cycle", details={"cycle": ["local/a", "local/a"]})
    error = map_tool_error(exc, skill_name="local/a")
    assert error.details == {"cycle": ["local/a", "local/a"], "exception_type": "IncludeCycleError"}


# --------------------------------------------------------------------------- frozen models


def _sample_models() -> list[BaseModel]:
    skill = Skill(name="local/s", tools=[_tool("local/t")])
    entries = _entries("local/s", *skill.tools)
    metadata = SkillMetadata.from_skill(skill, resolved=entries)
    error = SkillError(error_type=SkillErrorType.VALIDATION_ERROR, message="m", skill_name="x/y")
    return [
        error,
        metadata,
        SkillDefinition(skill=skill, resolved_tools=entries, metadata=metadata),
        SkillResult(skill_name="local/s", tool_name="local/t", success=False, error=error),
        metadata.capability_summary,
    ]


@pytest.mark.parametrize(
    ("model", "field"),
    list(
        zip(
            _sample_models(),
            ["message", "tool_count", "metadata", "success", "total_tools"],
            strict=True,
        )
    ),
    ids=lambda value: type(value).__name__ if isinstance(value, BaseModel) else value,
)
def test_protocol_models_are_frozen(model: BaseModel, field: str) -> None:
    with pytest.raises(ValidationError):
        setattr(model, field, getattr(model, field))


def test_skill_result_defaults() -> None:
    result = SkillResult(skill_name="local/s", tool_name="local/t", success=True)
    assert result.output_data is None
    assert result.error is None
    assert result.duration_ms == 0.0
    assert result.resource_changes == []


def test_skill_metadata_defaults() -> None:
    meta = SkillMetadata(name="local/s", description="d")
    assert meta.version == "0.0.0"
    assert meta.tool_count == 0
    assert meta.capability_summary == SkillCapabilitySummary()
    assert meta.source_types == []
    assert meta.writes is False
    assert meta.read_only is True


# --------------------------------------------------------------------------- SkillDefinition


def _definition(**overrides: Any) -> SkillDefinition:
    skill = Skill(name="local/s")
    fields: dict[str, Any] = {
        "skill": skill,
        "metadata": SkillMetadata.from_skill(skill, resolved=[]),
        **overrides,
    }
    return SkillDefinition(**fields)


@pytest.mark.parametrize("which", ["input_schema", "output_schema"])
def test_definition_rejects_a_schema_without_type(which: str) -> None:
    with pytest.raises(ValidationError, match="type"):
        _definition(**{which: {"properties": {"q": {"type": "string"}}}})


@pytest.mark.parametrize("which", ["input_schema", "output_schema"])
def test_definition_accepts_a_schema_with_type(which: str) -> None:
    definition = _definition(**{which: {"type": "object"}})
    assert getattr(definition, which) == {"type": "object"}


@pytest.mark.parametrize("flag", ["writes", "side_effects"])
def test_read_only_metadata_with_a_write_capable_tool_is_rejected(flag: str) -> None:
    flags: dict[str, Any] = {flag: True}
    writer = _tool("local/w", **flags)
    read_only_meta = SkillMetadata(name="local/s", description="", read_only=True)
    with pytest.raises(ValidationError, match="local/w"):
        _definition(resolved_tools=_entries("local/s", writer), metadata=read_only_meta)


def test_writing_metadata_with_a_write_capable_tool_is_accepted() -> None:
    writer = _tool("local/w", writes=True)
    skill = Skill(name="local/s", tools=[writer])
    entries = _entries("local/s", writer)
    definition = _definition(
        skill=skill,
        resolved_tools=entries,
        metadata=SkillMetadata.from_skill(skill, resolved=entries),
    )
    assert definition.metadata.writes is True


# --------------------------------------------------------------------------- from_skill


def test_from_skill_counts_every_kind_of_tool() -> None:
    tools = [
        _tool("local/read"),
        _tool("local/read-cmd", source="command"),
        _tool("local/write", writes=True),
        _tool("local/side", side_effects=True),
        _tool("local/both", source="command", writes=True, side_effects=True),
    ]
    skill = Skill(name="local/s", description="all kinds", version="3.1", tools=tools)

    meta = SkillMetadata.from_skill(skill, resolved=_entries("local/s", *tools))

    assert meta.name == "local/s"
    assert meta.description == "all kinds"
    assert meta.version == "3.1"
    assert meta.tool_count == 5
    assert meta.capability_summary == SkillCapabilitySummary(
        total_tools=5, read_tools=2, write_tools=2, side_effect_tools=2, has_side_effects=True
    )
    assert meta.source_types == ["command", "python"]
    assert meta.writes is True
    assert meta.read_only is False


def test_from_skill_with_only_read_tools_is_read_only() -> None:
    tools = [_tool("local/a"), _tool("local/b")]
    skill = Skill(name="local/s", tools=tools)
    meta = SkillMetadata.from_skill(skill, resolved=_entries("local/s", *tools))
    assert meta.writes is False
    assert meta.read_only is True
    assert meta.source_types == ["python"]
    assert meta.capability_summary.has_side_effects is False


def test_a_side_effect_only_tool_makes_the_skill_write_and_not_read_only() -> None:
    tool = _tool("local/ping", side_effects=True)
    skill = Skill(name="local/s", tools=[tool])
    meta = SkillMetadata.from_skill(skill, resolved=_entries("local/s", tool))
    assert meta.capability_summary.write_tools == 0
    assert meta.capability_summary.side_effect_tools == 1
    assert meta.writes is True
    assert meta.read_only is False


def test_from_skill_counts_resolved_tools_not_only_own_tools() -> None:
    own = _tool("local/own")
    included = _tool("local/included", source="command", writes=True)
    skill = Skill(name="local/s", tools=[own], includes=["local/other"])
    resolved = [
        ResolvedToolEntry(tool=own, source_skill="local/s"),
        ResolvedToolEntry(tool=included, source_skill="local/other", via=["local/other"]),
    ]
    meta = SkillMetadata.from_skill(skill, resolved=resolved)
    assert meta.tool_count == 2
    assert meta.source_types == ["command", "python"]
    assert meta.writes is True


def test_from_skill_without_resolved_uses_own_tools_and_version_override() -> None:
    skill = Skill(name="local/s", version="1.0.0", tools=[_tool("local/a")])
    meta = SkillMetadata.from_skill(skill, version="9.9.9")
    assert meta.tool_count == 1
    assert meta.version == "9.9.9"


def test_from_skill_of_an_empty_skill() -> None:
    meta = SkillMetadata.from_skill(Skill(name="local/empty"), resolved=[])
    assert meta.tool_count == 0
    assert meta.source_types == []
    assert meta.writes is False
    assert meta.read_only is True
