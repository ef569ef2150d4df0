"""The catalogue: every skill from a set of files, each resolved once."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cleveragents.error_types import SkillErrorType
from cleveragents.errors import ResolutionFailure, SkillNotFoundError, SkillResolutionError
from cleveragents.skills.loader import iter_skill_files, load_file
from cleveragents.skills.model import ResolvedToolEntry, Skill
from cleveragents.skills.protocol import SkillDefinition, SkillMetadata
from cleveragents.skills.resolver import resolve_skill

__all__ = ["Catalogue", "CatalogueProblem"]


@dataclass(frozen=True)
class CatalogueProblem:
    """One thing wrong with a catalogue: a bad file, a duplicate, an unresolvable skill."""

    where: str
    reason: str
    error_type: SkillErrorType | None = None

    def __str__(self) -> str:
        return f"{self.where}: {self.reason}"


class Catalogue:
    """Skills by name, each resolved once into a ``SkillDefinition``.

    Build one with ``Catalogue.from_paths`` (files and folders) or
    ``Catalogue.from_skills``. Problems never hide the good skills: they are
    listed in ``errors``.
    """

    def __init__(
        self,
        skills: Iterable[tuple[Skill, str]] = (),
        *,
        problems: Iterable[CatalogueProblem] = (),
    ) -> None:
        self.errors: list[CatalogueProblem] = list(problems)
        self._skills: dict[str, Skill] = {}
        self._origin: dict[str, str] = {}
        for skill, where in skills:
            if skill.name in self._skills:
                self.errors.append(
                    CatalogueProblem(
                        where,
                        f"duplicate skill {skill.name!r}: already defined in "
                        f"{self._origin[skill.name]} (the first one wins)",
                    )
                )
                continue
            self._skills[skill.name] = skill
            self._origin[skill.name] = where
        self._definitions: dict[str, SkillDefinition] = {}
        self._failures: dict[str, SkillResolutionError] = {}
        self._tools: dict[str, dict[str, ResolvedToolEntry]] = {}
        for name in sorted(self._skills):
            try:
                definition = resolve_skill(name, self._skills)
            except SkillResolutionError as exc:
                self._failures[name] = exc
                self.errors.append(CatalogueProblem(name, str(exc), exc.error_type))
                continue
            self._definitions[name] = definition
            self._tools[name] = {e.tool.name: e for e in definition.resolved_tools}

    @classmethod
    def from_paths(cls, *paths: str | Path) -> Catalogue:
        """Load every ``*.yaml``, ``*.yml`` and ``*.json`` skill file under ``paths``."""
        skills: list[tuple[Skill, str]] = []
        problems: list[CatalogueProblem] = []
        for path, unusable in iter_skill_files(paths):
            if unusable is not None:
                problems.append(CatalogueProblem(str(path), unusable))
                continue
            loaded, bad = load_file(path)
            skills.extend((item.skill, item.path) for item in loaded)
            problems.extend(CatalogueProblem(p.path, p.reason) for p in bad)
        return cls(skills, problems=problems)

    @classmethod
    def from_skills(cls, skills: Iterable[Skill]) -> Catalogue:
        """Build a catalogue from skill models (tests, embedding)."""
        return cls((skill, f"<skill {skill.name}>") for skill in skills)

    def __contains__(self, name: object) -> bool:
        return name in self._definitions

    def __len__(self) -> int:
        return len(self._definitions)

    @property
    def names(self) -> list[str]:
        """Names of the skills that resolved, sorted."""
        return sorted(self._definitions)

    def resolve(self, name: str) -> SkillDefinition:
        """The resolved skill; the same object every time.

        Raises:
            SkillNotFoundError: no such skill.
            SkillResolutionError: the skill exists but failed to resolve (its own error).
        """
        definition = self._definitions.get(name)
        if definition is not None:
            return definition
        failure = self._failures.get(name)
        if failure is not None:
            raise failure
        raise SkillNotFoundError(f"skill not found: {name}", details={"skill": name})

    def find_tool(self, skill: str, tool: str) -> tuple[SkillDefinition, ResolvedToolEntry]:
        """The resolved skill and one of its tools.

        Raises:
            ResolutionFailure: the tool is not among the skill's resolved tools.
        """
        definition = self.resolve(skill)
        entry = self._tools[skill].get(tool)
        if entry is None:
            raise ResolutionFailure(
                f"tool {tool!r} is not part of skill {skill!r}",
                details={"skill": skill, "tool": tool},
            )
        return definition, entry

    def list(self) -> list[SkillMetadata]:
        """Metadata of every skill that resolved, by name."""
        return [self._definitions[name].metadata for name in self.names]

    def origin(self, name: str) -> str | None:
        """The file (or label) a skill was read from."""
        return self._origin.get(name)
