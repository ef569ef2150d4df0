"""The catalogue: every skill from a set of files, each resolved once."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from cleveragents.errors import (
    CleverAgentsError,
    ResolutionFailure,
    SkillErrorType,
    SkillNotFoundError,
    SkillResolutionError,
)
from cleveragents.skills.loader import iter_skill_files, load_file
from cleveragents.skills.model import ResolvedToolEntry, Skill, ToolSpec
from cleveragents.skills.policies import Limits
from cleveragents.skills.protocol import SkillDefinition, SkillMetadata
from cleveragents.skills.resolver import resolve_skill

__all__ = ["Catalogue", "CatalogueProblem", "ToolPolicies"]

#: How alike a name must be to one in the catalogue to be named as the one meant.
_ALIKE = 0.8


def _meant(given: str, names: Iterable[str]) -> str | None:
    """The name a user probably meant by ``given``, which is not among ``names``.

    The same name in another namespace, or with the namespace left out (``hello``
    for ``me/hello``), or in another case; else a near spelling. None when nothing
    is that close: no guess is better than a wrong one.
    """
    known = sorted(names)
    last = given.rsplit("/", 1)[-1].casefold()
    same = [n for n in known if n.rsplit("/", 1)[-1].casefold() == last]
    if len(same) == 1:
        return same[0]
    close = difflib.get_close_matches(given, known, n=1, cutoff=_ALIKE)
    return close[0] if close else None


class ToolPolicies(NamedTuple):
    """A tool's retry and limits, with the skill that defines it and that skill's limits.

    Limits are kept per defining skill (``skill``), whichever skill a request names:
    a tool a second skill includes shares its limits with the first.
    """

    tool: ToolSpec
    skill: str
    skill_limits: Limits | None
    #: The lookup itself (the resolved skill asked for, and the tool's entry in it): it
    #: travels with the delivery, so that the runtime does not look the tool up again.
    found: tuple[SkillDefinition, ResolvedToolEntry] | None = None

    @property
    def limited(self) -> bool:
        """Whether any limit applies: the tool's own, or its skill's."""
        return bool(self.tool.limits or self.skill_limits)


@dataclass(frozen=True)
class CatalogueProblem:
    """One thing wrong with a catalogue: a bad file, a duplicate, an unresolvable skill.

    ``where`` is the file (``file[i]`` for an entry of a ``skills:`` list), the
    path that does not exist, or the skill's name; ``file`` and ``line`` say
    where to look, when known. Printed as ``file:line: reason``.
    """

    where: str
    reason: str
    error_type: SkillErrorType | None = None
    file: str | None = None
    line: int | None = None
    #: The skill a bad entry names, where it could be read (``resolve`` reports it).
    skill: str | None = None

    def __str__(self) -> str:
        if self.file is None or self.line is None:
            return f"{self.where}: {self.reason}"
        at = f"{self.file}:{self.line}"
        if self.where == self.file or self.where.startswith(f"{self.file}["):
            return f"{at}: {self.reason}"
        return f"{at}: {self.where}: {self.reason}"  # a skill's name


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
        missing_paths: Iterable[str] = (),
        locations: Mapping[str, tuple[str, int | None]] | None = None,
    ) -> None:
        """Resolve ``skills`` (each with where it was read).

        Args:
            problems: what went wrong loading them (kept in ``errors``, first).
            missing_paths: catalogue paths that do not exist (already in ``problems``);
                ``resolve`` names them when a skill is not found.
            locations: file and line of each ``where``, for the problems found here.
        """
        self.errors: list[CatalogueProblem] = list(problems)
        missing = list(missing_paths)
        #: Files and entries that did not load: they may hold a skill asked for.
        self._unloaded = [p for p in self.errors if p.where not in missing]
        self._missing_paths = [str(Path(p).absolute()) for p in missing]
        self._skills: dict[str, Skill] = {}
        self._origin: dict[str, str] = {}
        located = dict(locations or {})
        self._take(skills, located)
        self._definitions: dict[str, SkillDefinition] = {}
        self._failures: dict[str, SkillResolutionError] = {}
        self._tools: dict[str, dict[str, ResolvedToolEntry]] = {}
        self._located: dict[str, tuple[str, int | None]] = {
            name: located[where] for name, where in self._origin.items() if where in located
        }
        self._resolve_all()

    def _take(
        self, skills: Iterable[tuple[Skill, str]], located: Mapping[str, tuple[str, int | None]]
    ) -> None:
        """Keep each skill name's first definition; a later one is a problem."""
        for skill, where in skills:
            if skill.name in self._skills:
                first = self._origin[skill.name]
                file, line = located.get(first, (first, None))
                self.errors.append(
                    CatalogueProblem(
                        where,
                        f"duplicate skill {skill.name!r}: already defined in "
                        f"{f'{file}:{line}' if line else first} (the first one wins)",
                        SkillErrorType.RESOLUTION_FAILURE,
                        *located.get(where, (None, None)),
                    )
                )
                continue
            self._skills[skill.name] = skill
            self._origin[skill.name] = where

    def _resolve_all(self) -> None:
        """Resolve every skill once; one that cannot be resolved is a problem."""
        for name in sorted(self._skills):
            try:
                definition = resolve_skill(name, self._skills)
            except SkillResolutionError as exc:
                self._failures[name] = exc
                self.errors.append(
                    CatalogueProblem(name, str(exc), exc.error_type, *self.location(name))
                )
                continue
            self._definitions[name] = definition
            self._tools[name] = {e.tool.name: e for e in definition.resolved_tools}

    @classmethod
    def from_paths(cls, *paths: str | Path) -> Catalogue:
        """Load every ``*.yaml``, ``*.yml`` and ``*.json`` skill file under ``paths``."""
        skills: list[tuple[Skill, str]] = []
        problems: list[CatalogueProblem] = []
        missing: list[str] = []
        locations: dict[str, tuple[str, int | None]] = {}
        for path, unusable in iter_skill_files(paths):
            if unusable is not None:
                # Nothing can be found there: as for a missing include, nothing resolves.
                problems.append(
                    CatalogueProblem(
                        str(path), unusable, SkillErrorType.RESOLUTION_FAILURE, str(path)
                    )
                )
                missing.append(str(path))
                continue
            loaded, bad = load_file(path)
            for item in loaded:
                skills.append((item.skill, item.path))
                locations[item.path] = (item.file or str(path), item.line)
            problems.extend(
                CatalogueProblem(
                    p.path,
                    p.reason,
                    SkillErrorType.VALIDATION_ERROR,
                    p.file or str(path),
                    p.line,
                    p.skill,
                )
                for p in bad
            )
        return cls(skills, problems=problems, missing_paths=missing, locations=locations)

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
        raise self._not_found(name)

    def _not_found(self, name: str) -> SkillNotFoundError:
        """``skill not found``, and what in the catalogue may be why."""
        message = f"skill not found: {name}"
        details: dict[str, object] = {"skill": name}
        own = [p for p in self._unloaded if p.skill == name]
        if own:
            more = f" (and {len(own) - 1} more)" if len(own) > 1 else ""
            message += f"; its entry does not load: {own[0]}{more}"
        if self._missing_paths:
            paths = ", ".join(self._missing_paths)
            verb = "does" if len(self._missing_paths) == 1 else "do"
            message += f"; the catalogue path {paths} {verb} not exist"
            details["missing_catalogue_paths"] = list(self._missing_paths)
        guess = None if own else _meant(name, self.names)
        if guess is not None:
            message += f"; did you mean {guess!r}?"
            details["did_you_mean"] = guess
        unloaded = self._unloaded
        if unloaded:
            details["catalogue_load_problems"] = len(unloaded)
            if not own:
                count = "1 file problem" if len(unloaded) == 1 else f"{len(unloaded)} file problems"
                message += f"; {count} in the catalogue may hide it, first: {unloaded[0]}"
        return SkillNotFoundError(message, details=details)

    def find_tool(self, skill: str, tool: str) -> tuple[SkillDefinition, ResolvedToolEntry]:
        """The resolved skill and one of its tools.

        Raises:
            ResolutionFailure: the tool is not among the skill's resolved tools.
        """
        definition = self.resolve(skill)
        entry = self._tools[skill].get(tool)
        if entry is None:
            message = f"tool {tool!r} is not part of skill {skill!r}"
            details: dict[str, object] = {"skill": skill, "tool": tool}
            guess = _meant(tool, self._tools[skill])
            if guess is not None:
                message += f"; did you mean {guess!r}?"
                details["did_you_mean"] = guess
            raise ResolutionFailure(message, details=details)
        return definition, entry

    def policies(self, skill: Any, tool: Any) -> ToolPolicies | None:
        """The policies of the tool a request names (any values, as a producer sent
        them); None when there is no such tool (its run says why)."""
        found = self.lookup(skill, tool)
        return found if isinstance(found, ToolPolicies) else None

    def lookup(self, skill: Any, tool: Any) -> ToolPolicies | CleverAgentsError | None:
        """``policies``, or why there is no such tool (the error its run reports), or None
        when the names are not text (the request itself is refused)."""
        if not isinstance(skill, str) or not isinstance(tool, str):
            return None
        try:
            definition, entry = self.find_tool(skill, tool)
        except CleverAgentsError as exc:
            return exc
        source = entry.source_skill
        return ToolPolicies(entry.tool, source, self.skill_limits(source), (definition, entry))

    def own_tools(self, name: str) -> list[ToolSpec]:
        """The tools skill ``name`` defines itself (not those it includes)."""
        skill = self._skills.get(name)
        return [] if skill is None else list(skill.tools)

    def skill_limits(self, name: str) -> Limits | None:
        """The limits skill ``name`` declares for all its own tools, if any."""
        skill = self._skills.get(name)
        return None if skill is None else skill.limits

    def list(self) -> list[SkillMetadata]:
        """Metadata of every skill that resolved, by name."""
        return [self._definitions[name].metadata for name in self.names]

    def origin(self, name: str) -> str | None:
        """The file (or label) a skill was read from."""
        return self._origin.get(name)

    def location(self, name: str) -> tuple[str | None, int | None]:
        """The file a skill was read from and the line its entry starts on, when known."""
        return self._located.get(name, (None, None))
