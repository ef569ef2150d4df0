"""Flatten a skill's includes into one ordered list of tools.

Own tools first, then each include's, depth first in the order declared; a
skill reached twice (a diamond) contributes its tools once. Cycles, missing
includes and tool-name clashes fail with typed errors.
"""

from __future__ import annotations

from collections.abc import Mapping

from cleveragents.errors import (
    IncludeCycleError,
    ReadOnlyViolation,
    ResolutionFailure,
    SkillNotFoundError,
)
from cleveragents.skills.model import ResolvedToolEntry, Skill, ToolSpec
from cleveragents.skills.protocol import SkillDefinition, SkillMetadata

__all__ = ["resolve_skill"]


def resolve_skill(name: str, skills: Mapping[str, Skill]) -> SkillDefinition:
    """Resolve ``name`` against ``skills`` into a ``SkillDefinition``.

    Raises:
        SkillNotFoundError: ``name`` is not in ``skills``.
        IncludeCycleError: the includes loop; the message names the cycle.
        ResolutionFailure: a missing include, or two different tools with one name.
        ReadOnlyViolation: the skill asserts ``read_only: true`` but reaches a
            write-capable tool.
    """
    root = skills.get(name)
    if root is None:
        raise SkillNotFoundError(f"skill not found: {name}", details={"skill": name})
    entries = _Flattening(name, skills).run(root)
    _check_read_only(root, entries)
    return SkillDefinition(
        skill=root,
        resolved_tools=entries,
        metadata=SkillMetadata.from_skill(root, resolved=entries),
        input_schema=root.input_schema,
        output_schema=root.output_schema,
    )


class _Flattening:
    """One resolution of skill ``name``: the tools reached so far and the skills visited."""

    def __init__(self, name: str, skills: Mapping[str, Skill]) -> None:
        self._name = name
        self._skills = skills
        self._entries: list[ResolvedToolEntry] = []
        self._by_name: dict[str, ResolvedToolEntry] = {}
        self._visited: set[str] = set()

    def run(self, root: Skill) -> list[ResolvedToolEntry]:
        """The root's tools, then each include's, depth first; each tool once."""
        self._walk(root, [self._name], [])
        return self._entries

    def _add_tools(self, skill: Skill, via: list[str]) -> None:
        for tool in skill.tools:
            seen = self._by_name.get(tool.name)
            if seen is None:
                entry = ResolvedToolEntry(tool=tool, source_skill=skill.name, via=list(via))
                self._by_name[tool.name] = entry
                self._entries.append(entry)
            elif seen.tool != tool:
                raise ResolutionFailure(
                    f"skill {self._name!r} reaches two different tools named {tool.name!r} "
                    f"(in {seen.source_skill!r} and {skill.name!r})",
                    details={"tool": tool.name, "skills": [seen.source_skill, skill.name]},
                )

    def _walk(self, skill: Skill, path: list[str], via: list[str]) -> None:
        self._visited.add(skill.name)
        self._add_tools(skill, via)
        for include in skill.includes:
            if include in path:
                cycle = [*path[path.index(include) :], include]
                raise IncludeCycleError(
                    f"include cycle detected: {' -> '.join(cycle)}",
                    details={"cycle": cycle},
                )
            if include in self._visited:
                continue  # a diamond: its tools are already in
            child = self._skills.get(include)
            if child is None:
                raise ResolutionFailure(
                    f"skill {skill.name!r} includes {include!r}, which is not in the catalogue",
                    details={"skill": skill.name, "missing_include": include},
                )
            self._walk(child, [*path, include], [*via, include])


def _check_read_only(skill: Skill, entries: list[ResolvedToolEntry]) -> None:
    if skill.read_only is not True:
        return
    writers: list[ToolSpec] = [e.tool for e in entries if e.tool.write_capable]
    if writers:
        names = ", ".join(t.name for t in writers)
        raise ReadOnlyViolation(
            f"skill {skill.name!r} declares read_only: true but reaches write-capable "
            f"tools: {names}",
            details={"write_capable_tools": [t.name for t in writers]},
        )
