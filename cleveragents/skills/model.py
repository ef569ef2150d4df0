"""The skill model: tools, skills, resolved entries and capability summaries."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from cleveragents.skills import tool_kinds
from cleveragents.skills.json_schemas import schema_problem
from cleveragents.skills.policies import Limits, RetryPolicy, Sandbox

__all__ = [
    "NAME_PATTERN",
    "SKILL_FOLDER_CONTEXT",
    "ResolvedToolEntry",
    "Skill",
    "SkillCapabilitySummary",
    "ToolSpec",
]

#: A namespaced name: ``ns/name`` (more segments allowed, ``org/team/name``).
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)+$"
_NAME_RE = re.compile(NAME_PATTERN)
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

_FROZEN = ConfigDict(frozen=True, extra="forbid")
#: The validation-context key that tells a skill file's tools their folder (the loader sets it).
SKILL_FOLDER_CONTEXT = "skill_folder"


def _check_name(value: str, what: str) -> str:
    if not _NAME_RE.match(value):
        raise ValueError(f"{what} name {value!r} must be namespaced, like 'local/word-count'")
    return value


#: Keywords that point at another schema: only a place inside this one may be named.
_REF_KEYWORDS = ("$ref", "$dynamicRef", "$recursiveRef")


def _refs_inside(schema: dict[str, Any] | None) -> dict[str, Any] | None:
    """``schema``, when every reference in it points inside it (``#...``).

    A reference to a file or a URL would make every worker, ``mcp serve`` and
    ``skills check`` read it: never fetched, so a problem of the skill file.
    """
    stack: list[Any] = [schema]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                if key in _REF_KEYWORDS and isinstance(item, str) and not item.startswith("#"):
                    shown = item if len(item) <= 60 else item[:57] + "..."
                    raise ValueError(
                        f"{key} {shown!r} reaches outside the schema: references are "
                        "followed only inside the schema itself ('#/...'); nothing is fetched"
                    )
                stack.append(item)
        elif isinstance(value, list):
            stack.extend(value)
    return schema


def _valid_schema(schema: dict[str, Any] | None) -> dict[str, Any] | None:
    """``schema``, when it is a valid JSON Schema (checked as its file loads, at its line)."""
    if schema is not None:
        problem = schema_problem(schema)
        if problem is not None:
            raise ValueError(f"not a valid JSON Schema: {problem}")
    return schema


class ToolSpec(BaseModel):
    """One tool: which kind runs it, what it may touch, and its schemas.

    ``source`` names a registered tool kind (``python``, ``command``, or one a
    plugin added, ``cleveragents.runtime.register_tool_kind``); the kind checks
    the fields it needs. ``options`` holds a kind's own settings: the keys it
    declares may also be written beside the common ones in a skill file.

    A tool read from a skill file knows that file's folder (``skill_folder``):
    python entrypoints import from it first and relative paths in ``command``
    resolve against it (docs/skills.md, "A skill folder is a unit"). It is not a
    field: it never appears in a dump or on the wire, and a tool built in code has
    none. Two tools alike in every field but from two folders are two tools.
    """

    model_config = _FROZEN

    name: str
    description: str = ""
    source: str
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
    #: Kind-specific settings (an ``mcp`` tool's ``server`` and ``remote_tool``).
    options: dict[str, Any] = Field(default_factory=dict)
    #: How a transient failure is retried (``cleveragents.skills.policies``).
    retry: RetryPolicy | None = None
    #: Fleet-wide limits: runs at once, starts per window.
    limits: Limits | None = None
    #: Each invocation waits for a person's decision before it runs (docs/approvals.md).
    requires_approval: bool = False
    #: The name MCP clients see for this tool (``mcp serve``, ``skills export --format
    #: mcp``); None: made from the skill's and the tool's names (docs/mcp.md).
    mcp_name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_-]{1,64}$")
    #: Run in a Linux sandbox (``true``, or a mapping; ``cleveragents.skills.policies``):
    #: command tools and stdio MCP servers only (docs/runtime.md "Sandboxed tools").
    sandbox: Sandbox | None = None
    _skill_folder: Path | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _collect_options(cls, data: Any) -> Any:
        # A kind's own keys sit beside the common ones in a file (SPEC: `server:`);
        # they are kept in `options`, so the model needs no field per kind.
        if not isinstance(data, dict) or not isinstance(data.get("source"), str):
            return data
        if not tool_kinds.is_known(data["source"]):
            return data
        own = tool_kinds.option_fields(data["source"]) & data.keys()
        if not own:
            return data
        options = data.get("options") or {}
        if not isinstance(options, dict):
            return data  # the field's own validation reports it
        twice = sorted(own & options.keys())
        if twice:
            raise ValueError(f"{', '.join(twice)} given both as a key and in options")
        rest = {k: v for k, v in data.items() if k not in own}
        return {**rest, "options": {**options, **{k: data[k] for k in own}}}

    @field_validator("name")
    @classmethod
    def _namespaced(cls, value: str) -> str:
        return _check_name(value, "tool")

    @field_validator("input_schema", "output_schema")
    @classmethod
    def _schema_refs_inside(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return _valid_schema(_refs_inside(value))

    @field_validator("source")
    @classmethod
    def _known_kind(cls, value: str) -> str:
        if not tool_kinds.is_known(value):
            raise ValueError(
                f"unknown tool source {value!r}; known: {', '.join(tool_kinds.kind_names())}"
            )
        return value

    @field_validator("pass_env")
    @classmethod
    def _env_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not _ENV_NAME_RE.match(name):
                raise ValueError(f"pass_env entry {name!r} is not an environment variable name")
        return value

    @field_validator("sandbox", mode="before")
    @classmethod
    def _sandbox_flag(cls, value: Any) -> Any:
        # `sandbox: true` is the default sandbox; `false` is none of its own.
        if value is True:
            return {}
        return None if value is False else value

    @model_validator(mode="after")
    def _kind_fields(self, info: ValidationInfo) -> ToolSpec:
        folder = (info.context or {}).get(SKILL_FOLDER_CONTEXT)
        if folder is not None:
            self._skill_folder = Path(folder).absolute()
        if self.sandbox is not None and self.sandbox.allow_write and not self.writes:
            raise ValueError(
                f"tool {self.name!r} is read-only (writes: false), so its sandbox takes no "
                "allow_write: set writes: true, or drop allow_write"
            )
        tool_kinds.check_tool(self)
        return self

    @property
    def skill_folder(self) -> Path | None:
        """The folder of the skill file this tool was read from (None: built in code)."""
        # Read from pydantic's own store of private attributes: ``self._skill_folder``
        # goes through ``BaseModel.__getattr__``, 5 us a call, on every python tool call.
        private = self.__pydantic_private__
        return None if private is None else private.get("_skill_folder")

    @property
    def write_capable(self) -> bool:
        """True when the tool writes or has side effects: what the gates look at."""
        return self.writes or self.side_effects


tool_kinds.reserve_fields(ToolSpec.model_fields)


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
    #: Fleet-wide limits shared by all the skill's own tools.
    limits: Limits | None = None

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
        return _valid_schema(_refs_inside(value))

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
