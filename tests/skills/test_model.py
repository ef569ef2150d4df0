"""The skill model: ``ToolSpec`` and ``Skill`` validation (SPEC section 4)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from cleveragents.skills import ResolvedToolEntry, Skill, SkillCapabilitySummary, ToolSpec


def _python_tool(**overrides: Any) -> dict[str, Any]:
    return {
        "name": "local/word-count",
        "source": "python",
        "entrypoint": "cleveragents.examples.tools:word_count",
        **overrides,
    }


def _command_tool(**overrides: Any) -> dict[str, Any]:
    return {
        "name": "local/line-stats",
        "source": "command",
        "command": ["python3", "-m", "cleveragents.examples.line_stats"],
        **overrides,
    }


# --------------------------------------------------------------------------- ToolSpec


def test_a_python_tool_has_the_documented_defaults() -> None:
    tool = ToolSpec.model_validate(_python_tool())
    assert tool.description == ""
    assert tool.command is None
    assert (tool.writes, tool.side_effects, tool.idempotent) == (False, False, False)
    assert tool.timeout_s is None
    assert tool.input_schema is None
    assert tool.output_schema is None
    assert tool.pass_env == []


@pytest.mark.parametrize("name", ["local/word-count", "org/team/tool", "a1/b.c_d-e"])
def test_namespaced_tool_names_are_accepted(name: str) -> None:
    assert ToolSpec.model_validate(_python_tool(name=name)).name == name


@pytest.mark.parametrize("name", ["word-count", "local/", "/word-count", "local//x", "", "a b/c"])
def test_tool_names_must_be_namespaced(name: str) -> None:
    with pytest.raises(ValidationError, match="namespaced"):
        ToolSpec.model_validate(_python_tool(name=name))


@pytest.mark.parametrize(
    "entrypoint",
    ["cleveragents.examples.tools:word_count", "tools:f", "a.b.c:Klass.method"],
)
def test_python_entrypoints_of_the_form_module_function_are_accepted(entrypoint: str) -> None:
    assert ToolSpec.model_validate(_python_tool(entrypoint=entrypoint)).entrypoint == entrypoint


@pytest.mark.parametrize(
    "entrypoint",
    [None, "", "examples.tools", "examples.tools:", ":word_count", "examples tools:f", "a:b:c"],
)
def test_a_python_tool_needs_a_module_function_entrypoint(entrypoint: str | None) -> None:
    data = _python_tool(entrypoint=entrypoint)
    with pytest.raises(ValidationError, match="module:function"):
        ToolSpec.model_validate(data)


def test_a_python_tool_may_not_set_a_command() -> None:
    with pytest.raises(ValidationError, match="command"):
        ToolSpec.model_validate(_python_tool(command=["echo"]))


@pytest.mark.parametrize("command", [None, [], [""], ["python3", ""]])
def test_a_command_tool_needs_a_non_empty_argv(command: list[str] | None) -> None:
    with pytest.raises(ValidationError, match="non-empty"):
        ToolSpec.model_validate(_command_tool(command=command))


def test_a_command_tool_may_not_set_an_entrypoint() -> None:
    with pytest.raises(ValidationError, match="entrypoint"):
        ToolSpec.model_validate(_command_tool(entrypoint="cleveragents.examples.tools:echo"))


def test_source_is_python_or_command() -> None:
    with pytest.raises(ValidationError):
        ToolSpec.model_validate(_command_tool(source="shell"))


def test_unknown_tool_keys_are_rejected() -> None:
    with pytest.raises(ValidationError, match="colour"):
        ToolSpec.model_validate(_python_tool(colour="red"))


@pytest.mark.parametrize("timeout", [0, -1, -0.5])
def test_timeout_must_be_positive(timeout: float) -> None:
    with pytest.raises(ValidationError, match="timeout_s"):
        ToolSpec.model_validate(_command_tool(timeout_s=timeout))


def test_a_fractional_timeout_is_accepted() -> None:
    assert ToolSpec.model_validate(_command_tool(timeout_s=0.25)).timeout_s == 0.25


def test_pass_env_accepts_environment_variable_names() -> None:
    names = ["HOME", "_PRIVATE", "CLEVERAGENTS_NOTES_DIR", "x1"]
    assert ToolSpec.model_validate(_command_tool(pass_env=names)).pass_env == names


@pytest.mark.parametrize("name", ["1ABC", "A-B", "A B", "", "A=B", "$HOME"])
def test_pass_env_rejects_what_is_not_an_environment_variable_name(name: str) -> None:
    with pytest.raises(ValidationError, match="pass_env"):
        ToolSpec.model_validate(_command_tool(pass_env=[name]))


@pytest.mark.parametrize(
    ("flags", "capable"),
    [({}, False), ({"writes": True}, True), ({"side_effects": True}, True)],
)
def test_write_capable_means_writes_or_side_effects(flags: dict[str, bool], capable: bool) -> None:
    assert ToolSpec.model_validate(_python_tool(**flags)).write_capable is capable


def test_tool_specs_are_frozen() -> None:
    tool = ToolSpec.model_validate(_python_tool())
    with pytest.raises(ValidationError):
        tool.writes = True  # type: ignore[misc]


# --------------------------------------------------------------------------- Skill


def test_a_skill_has_the_documented_defaults() -> None:
    skill = Skill(name="local/s")
    assert skill.description == ""
    assert skill.version == "0.0.0"
    assert skill.includes == []
    assert skill.tools == []
    assert skill.read_only is None
    assert skill.input_schema is None
    assert skill.output_schema is None


@pytest.mark.parametrize("name", ["notes", "local/", "/notes", ""])
def test_skill_names_must_be_namespaced(name: str) -> None:
    with pytest.raises(ValidationError, match="namespaced"):
        Skill(name=name)


def test_included_skill_names_must_be_namespaced() -> None:
    with pytest.raises(ValidationError, match="namespaced"):
        Skill(name="local/s", includes=["local/ok", "common"])


def test_unknown_skill_keys_are_rejected() -> None:
    with pytest.raises(ValidationError, match="include"):
        Skill.model_validate({"name": "local/s", "include": ["local/common"]})


@pytest.mark.parametrize(
    ("raw", "text"),
    [(1.2, "1.2"), (2, "2"), ("1.10", "1.10"), ("1.2.0", "1.2.0")],
)
def test_a_numeric_version_becomes_text(raw: float | str, text: str) -> None:
    assert Skill.model_validate({"name": "local/s", "version": raw}).version == text


def test_a_boolean_version_is_rejected() -> None:
    with pytest.raises(ValidationError, match="version"):
        Skill.model_validate({"name": "local/s", "version": True})


def test_a_skill_may_not_define_the_same_tool_twice() -> None:
    with pytest.raises(ValidationError, match="twice"):
        Skill.model_validate(
            {"name": "local/s", "tools": [_python_tool(), _python_tool(description="again")]}
        )


def test_tools_are_validated_inside_a_skill() -> None:
    with pytest.raises(ValidationError, match="module:function"):
        Skill.model_validate({"name": "local/s", "tools": [_python_tool(entrypoint="nope")]})


@pytest.mark.parametrize("which", ["input_schema", "output_schema"])
def test_a_skill_schema_without_type_is_rejected(which: str) -> None:
    with pytest.raises(ValidationError, match="type"):
        Skill.model_validate({"name": "local/s", which: {"properties": {}}})


def test_a_complete_skill_parses() -> None:
    skill = Skill.model_validate(
        {
            "name": "local/text-tools",
            "description": "Small text utilities",
            "version": "1.2.0",
            "includes": ["local/common"],
            "read_only": True,
            "tools": [_python_tool(), _command_tool(timeout_s=5, writes=True)],
            "input_schema": {"type": "object"},
            "output_schema": {"type": "object"},
        }
    )
    assert [t.name for t in skill.tools] == ["local/word-count", "local/line-stats"]
    assert skill.tools[1].timeout_s == 5.0
    assert skill.read_only is True


def test_skills_are_frozen() -> None:
    skill = Skill(name="local/s")
    with pytest.raises(ValidationError):
        skill.version = "2"  # type: ignore[misc]


# --------------------------------------------------------------------------- entries, summaries


def test_a_resolved_entry_defaults_to_an_empty_via() -> None:
    entry = ResolvedToolEntry(tool=ToolSpec.model_validate(_python_tool()), source_skill="local/s")
    assert entry.via == []


def test_capability_summary_defaults_are_zero() -> None:
    assert SkillCapabilitySummary() == SkillCapabilitySummary(
        total_tools=0, read_tools=0, write_tools=0, side_effect_tools=0, has_side_effects=False
    )
