"""The skill model: tools, skills, resolved entries and capability summaries."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "NAME_PATTERN",
    "ResolvedToolEntry",
    "Skill",
    "SkillCapabilitySummary",
    "ToolSpec",
]

#: A namespaced name: ``ns/name`` (more segments allowed, ``org/team/name``).
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)+$"
_NAME_RE = re.compile(NAME_PATTERN)
_ENTRYPOINT_RE = re.compile(
    r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$"
)
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

_FROZEN = ConfigDict(frozen=True, extra="forbid")


def _check_name(value: str, what: str) -> str:
    if not _NAME_RE.match(value):
        raise ValueError(f"{what} name {value!r} must be namespaced, like 'local/word-count'")
    return value


class ToolSpec(BaseModel):
    """One tool: where its code lives, what it may touch, and its schemas."""

    model_config = _FROZEN

    name: str
    description: str = ""
    source: Literal["python", "command"]
    entrypoint: str | None = None
    command: list[str] | None = None
    writes: bool = False
    side_effects: bool = False
    idempotent: bool = False
    timeout_s: float | None = Field(default=None, gt=0)
    input_schema: dict[str, Any] | None = None
    output_schema: dict[str, Any] | None = None
    #: Environment variables a command tool receives from the worker, by name.
    pass_env: list[str] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _namespaced(cls, value: str) -> str:
        return _check_name(value, "tool")

    @field_validator("pass_env")
    @classmethod
    def _env_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not _ENV_NAME_RE.match(name):
                raise ValueError(f"pass_env entry {name!r} is not an environment variable name")
        return value

    @model_validator(mode="after")
    def _source_fields(self) -> ToolSpec:
        if self.source == "python":
            if not self.entrypoint or not _ENTRYPOINT_RE.match(self.entrypoint):
                raise ValueError(
                    f"python tool {self.name!r} needs entrypoint 'module:function', "
                    f"got {self.entrypoint!r}"
                )
            if self.command is not None:
                raise ValueError(f"python tool {self.name!r} must not set command")
        else:
            if not self.command or not all(isinstance(a, str) and a for a in self.command):
                raise ValueError(
                    f"command tool {self.name!r} needs command: a non-empty list of strings"
                )
            if self.entrypoint is not None:
                raise ValueError(f"command tool {self.name!r} must not set entrypoint")
        return self

    @property
    def write_capable(self) -> bool:
        """True when the tool writes or has side effects: what the gates look at."""
        return self.writes or self.side_effects


class Skill(BaseModel):
    """A named, versioned set of tools, possibly including other skills."""

    model_config = _FROZEN

    name: str
    description: str = ""
    version: str = "0.0.0"
    includes: list[str] = Field(default_factory=list)
    tools: list[ToolSpec] = Field(default_factory=list)
    read_only: bool | None = None
    input_schema: dict[str, Any] | None = None
    output_schema: dict[str, Any] | None = None

    @field_validator("name")
    @classmethod
    def _namespaced(cls, value: str) -> str:
        return _check_name(value, "skill")

    @field_validator("includes")
    @classmethod
    def _include_names(cls, value: list[str]) -> list[str]:
        for name in value:
            _check_name(name, "included skill")
        return value

    @field_validator("input_schema", "output_schema")
    @classmethod
    def _schema_typed(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        # Checked here too, so a bad schema is a load problem of its file rather
        # than a pydantic error escaping resolution (SkillDefinition rejects it).
        if value is not None and "type" not in value:
            raise ValueError("a skill's JSON Schema must include a 'type' key")
        return value

    @field_validator("version", mode="before")
    @classmethod
    def _version_text(cls, value: Any) -> Any:
        # JSON numbers and YAML numbers read without our loader become text.
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
        return value

    @model_validator(mode="after")
    def _unique_own_tools(self) -> Skill:
        seen: set[str] = set()
        for tool in self.tools:
            if tool.name in seen:
                raise ValueError(f"skill {self.name!r} defines tool {tool.name!r} twice")
            seen.add(tool.name)
        return self


class ResolvedToolEntry(BaseModel):
    """A tool reached by resolving a skill, with where it came from."""

    model_config = _FROZEN

    tool: ToolSpec
    source_skill: str
    via: list[str] = Field(default_factory=list)


class SkillCapabilitySummary(BaseModel):
    """Counts of what a skill's resolved tools can do."""

    model_config = _FROZEN

    total_tools: int = 0
    read_tools: int = 0
    write_tools: int = 0
    side_effect_tools: int = 0
    has_side_effects: bool = False

    @classmethod
    def of(cls, tools: list[ToolSpec]) -> SkillCapabilitySummary:
        """Summarise a list of tools."""
        side = sum(1 for t in tools if t.side_effects)
        return cls(
            total_tools=len(tools),
            read_tools=sum(1 for t in tools if not t.write_capable),
            write_tools=sum(1 for t in tools if t.writes),
            side_effect_tools=side,
            has_side_effects=side > 0,
        )
