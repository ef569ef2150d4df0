"""The MCP face of a catalogue: one MCP tool per (skill, tool) pair, and the way back.

``cleveragents mcp serve`` lists exactly what ``cleveragents skills export --format
mcp`` prints (``cleveragents.skills.mcp_tools``): the same deterministic names, within
MCP's name rules and 64 characters, with a digest for long or clashing names, and
the real skill and tool in ``_meta`` (``cleveragents/skill``, ``cleveragents/tool``).
A ``ToolTable`` keeps those definitions and maps a called name back to its pair.
Pure data: no SDK, no queue.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cleveragents.skills import Catalogue
from cleveragents.skills.mcp_tools import META_PREFIX, export_catalogue

__all__ = ["META_SKILL", "META_TOOL", "ToolRoute", "ToolTable"]

#: ``_meta`` key holding the real skill name behind an MCP tool name.
META_SKILL = f"{META_PREFIX}skill"
#: ``_meta`` key holding the real tool name behind an MCP tool name.
META_TOOL = f"{META_PREFIX}tool"
_META_WRITES = f"{META_PREFIX}requires_allow_writes"


@dataclass(frozen=True)
class ToolRoute:
    """Where an MCP tool name leads: the skill and tool it runs, and whether it may write."""

    name: str
    skill: str
    tool: str
    write_capable: bool


def _route(definition: Mapping[str, Any]) -> ToolRoute:
    meta = definition["_meta"]
    return ToolRoute(
        name=definition["name"],
        skill=meta[META_SKILL],
        tool=meta[META_TOOL],
        write_capable=bool(meta[_META_WRITES]),
    )


@dataclass(frozen=True)
class ToolTable:
    """The MCP tool definitions of a catalogue, and their routes by MCP name."""

    tools: tuple[dict[str, Any], ...] = ()
    routes: Mapping[str, ToolRoute] = field(default_factory=dict)
    #: The (skill, tool) pairs left out, with why (no JSON object passes their input schema).
    skipped: tuple[str, ...] = ()

    @classmethod
    def from_catalogue(cls, catalogue: Catalogue) -> ToolTable:
        """Every (skill, tool) pair of the skills that resolve, named as the export names them."""
        exported = export_catalogue(catalogue)
        # export_catalogue guarantees unique names matching NAME_RE (``[A-Za-z0-9_-]{1,64}``).
        routes = {d["name"]: _route(d) for d in exported.tools}
        return cls(tuple(exported.tools), routes, tuple(exported.skipped))

    def route(self, name: str) -> ToolRoute | None:
        """The pair behind the MCP tool ``name``, or None when there is no such tool."""
        return self.routes.get(name)

    def __len__(self) -> int:
        return len(self.tools)
