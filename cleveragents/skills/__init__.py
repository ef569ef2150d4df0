"""Skills: the protocol types, the skill model, the catalogue and the resolver."""

from cleveragents.skills.catalogue import Catalogue, CatalogueProblem
from cleveragents.skills.model import (
    ResolvedToolEntry,
    Skill,
    SkillCapabilitySummary,
    ToolSpec,
)
from cleveragents.skills.protocol import (
    SkillDefinition,
    SkillError,
    SkillErrorType,
    SkillMetadata,
    SkillResult,
    map_tool_error,
)
from cleveragents.skills.resolver import resolve_skill

__all__ = [
    "Catalogue",
    "CatalogueProblem",
    "ResolvedToolEntry",
    "Skill",
    "SkillCapabilitySummary",
    "SkillDefinition",
    "SkillError",
    "SkillErrorType",
    "SkillMetadata",
    "SkillResult",
    "ToolSpec",
    "map_tool_error",
    "resolve_skill",
]
