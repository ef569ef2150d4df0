"""Read skill files (YAML or JSON) into ``Skill`` models, reporting every bad one."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from cleveragents.skills.model import Skill

__all__ = ["SKILL_FILE_SUFFIXES", "LoadProblem", "LoadedSkill", "iter_skill_files", "load_file"]

SKILL_FILE_SUFFIXES = (".yaml", ".yml", ".json")


@dataclass(frozen=True)
class LoadedSkill:
    """A skill read from a file, with where it came from."""

    skill: Skill
    path: str


@dataclass(frozen=True)
class LoadProblem:
    """A file, or one entry of a file, that could not be read as a skill."""

    path: str
    reason: str


_BaseLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present


class _SkillYamlLoader(_BaseLoader):  # type: ignore[misc]
    """Safe YAML loader that keeps ``version`` exactly as written (``1.10`` stays ``"1.10"``)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        for key_node, value_node in node.value:
            if (
                isinstance(key_node, yaml.ScalarNode)
                and key_node.value == "version"
                and isinstance(value_node, yaml.ScalarNode)
                and value_node.tag in ("tag:yaml.org,2002:float", "tag:yaml.org,2002:int")
            ):
                mapping["version"] = value_node.value
        return mapping


def iter_skill_files(paths: Iterable[str | Path]) -> Iterator[tuple[Path, str | None]]:
    """Yield every skill file under ``paths`` in sorted order, or a reason a path is unusable."""
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files = sorted(
                p for p in path.rglob("*") if p.is_file() and p.suffix in SKILL_FILE_SUFFIXES
            )
            yield from ((f, None) for f in files)
        elif path.is_file():
            yield path, None
        else:
            yield path, "no such file or folder"


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"])
        parts.append(f"{where}: {err['msg']}" if where else err["msg"])
    return "; ".join(parts)


def load_file(path: Path) -> tuple[list[LoadedSkill], list[LoadProblem]]:
    """Read one file: one skill, or a list of skills under a top-level ``skills:`` key."""
    where = str(path)
    try:
        text = path.read_text(encoding="utf-8")
        data: Any = (
            json.loads(text) if path.suffix == ".json" else yaml.load(text, _SkillYamlLoader)
        )
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError) as exc:
        reason = str(exc).replace("\n", " ")
        return [], [LoadProblem(where, f"cannot parse: {reason}")]
    if isinstance(data, dict) and set(data) == {"skills"}:
        items = data["skills"]
        if not isinstance(items, list):
            return [], [LoadProblem(where, "'skills' must be a list of skills")]
        labelled = [(f"{where}[{i}]", item) for i, item in enumerate(items)]
    elif isinstance(data, dict):
        labelled = [(where, data)]
    else:
        return [], [LoadProblem(where, "a skill file holds a mapping (one skill or 'skills:')")]
    skills: list[LoadedSkill] = []
    problems: list[LoadProblem] = []
    for label, item in labelled:
        if not isinstance(item, dict):
            problems.append(LoadProblem(label, "a skill must be a mapping"))
            continue
        try:
            skills.append(LoadedSkill(Skill.model_validate(item), label))
        except ValidationError as exc:
            problems.append(LoadProblem(label, _describe(exc)))
    return skills, problems
