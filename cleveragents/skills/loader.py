"""Read skill files (YAML or JSON) into ``Skill`` models, reporting every bad one.

Every problem carries the line it is on (``diagnostics``): a file is parsed once
into its data and its YAML node tree, whose nodes know their lines.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from cleveragents.constants import (
    ALIAS_EXPANSION_FACTOR,
    ALIAS_EXPANSION_FLOOR,
    MAX_SKILL_FILE_BYTES,
)
from cleveragents.skills.diagnostics import entry_problems, line_of, syntax_problem
from cleveragents.skills.model import SKILL_FOLDER_CONTEXT, Skill

__all__ = ["SKILL_FILE_SUFFIXES", "LoadProblem", "LoadedSkill", "iter_skill_files", "load_file"]

SKILL_FILE_SUFFIXES = (".yaml", ".yml", ".json")


@dataclass(frozen=True)
class LoadedSkill:
    """A skill read from a file, with where it came from."""

    skill: Skill
    path: str
    #: The file, and the line the skill's entry starts on (None: not known).
    file: str | None = None
    line: int | None = None


@dataclass(frozen=True)
class LoadProblem:
    """A file, or one entry of a file, that could not be read as a skill."""

    path: str
    reason: str
    #: The line the problem is on (1-based; None: the whole file, or not known).
    line: int | None = None
    #: The name the bad entry gives its skill, where it could be read.
    skill: str | None = None
    #: The file (``path`` is ``file[i]`` for an entry of a ``skills:`` list).
    file: str | None = None


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


def _parse(text: str, path: Path) -> tuple[Any, yaml.Node | None]:
    """The file's data and its node tree (for lines; JSON's too, as YAML reads JSON)."""
    if path.suffix == ".json":
        data = json.loads(text)
        try:
            return data, yaml.compose(text, _BaseLoader)
        except yaml.YAMLError:  # valid JSON that YAML reads differently: no lines
            return data, None
    loader = _SkillYamlLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None:
            _refuse_alias_bomb(node, len(text.encode()))
        return (loader.construct_document(node) if node is not None else None), node
    finally:
        loader.dispose()


class AliasBomb(ValueError):
    """Raised when a file's aliases would expand it far past its own size."""

    def __init__(self, expanded: int, size: int, node: yaml.Node) -> None:
        super().__init__(
            f"its aliases would expand it to more than {expanded:,} bytes, over "
            f"{ALIAS_EXPANSION_FACTOR} times its own {size:,}: an alias bomb, not read "
            "(write the repeated part out, or refer to it less)"
        )
        self.line = node.start_mark.line + 1


def _refuse_alias_bomb(root: yaml.Node, size: int) -> None:
    """Refuse a node graph whose aliases expand past a small multiple of the file's size.

    An alias is the same node object met again, so the graph is composed cheaply; what
    costs is what later code does with the expanded data. Each distinct node's expanded
    size is computed once (post-order, no recursion), in scalar bytes.
    """
    limit = ALIAS_EXPANSION_FACTOR * size + ALIAS_EXPANSION_FLOOR
    expanded: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in expanded:
            continue
        children = _children(node)
        if not children_done and children:
            stack.append((node, True))
            stack.extend((child, False) for child in children if id(child) not in expanded)
            continue
        total = len(str(node.value)) if isinstance(node, yaml.ScalarNode) else 1
        total += sum(expanded[id(child)] for child in children)
        expanded[id(node)] = total
        if total > limit:  # the innermost node past the limit: where the blow-up is
            raise AliasBomb(limit, size, node)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _item_nodes(node: yaml.Node | None, count: int) -> list[yaml.Node | None]:
    """The nodes of the entries of a ``skills:`` list (None each when unknown)."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if (
                key.value == "skills"
                and isinstance(value, yaml.SequenceNode)
                and len(value.value) == count
            ):
                return list(value.value)
    return [None] * count


#: One entry of a file: its label (the file, or ``file[i]`` in a ``skills:`` list), its
#: data and its YAML node.
_Entry = tuple[str, Any, "yaml.Node | None"]


def load_file(path: Path) -> tuple[list[LoadedSkill], list[LoadProblem]]:
    """Read one file: one skill, or a list of skills under a top-level ``skills:`` key."""
    where = str(path)
    read = _read(path)
    if isinstance(read, LoadProblem):
        return [], [read]
    entries = _entries(where, *read)
    if isinstance(entries, LoadProblem):
        return [], [entries]
    return _validated(entries, path.parent.resolve(), where)


def _read(path: Path) -> tuple[Any, yaml.Node | None] | LoadProblem:
    """The file's data and node tree, or why it cannot be read (too large, a bomb, bad syntax)."""
    where = str(path)
    text = ""
    try:
        size = path.stat().st_size
        if size > MAX_SKILL_FILE_BYTES:
            reason = (
                f"the file is {size:,} bytes, over the {MAX_SKILL_FILE_BYTES:,} bytes a skill "
                "file may hold: not read (split it into several files)"
            )
            return LoadProblem(where, reason, file=where)
        text = path.read_text(encoding="utf-8")
        return _parse(text, path)
    except AliasBomb as exc:
        return LoadProblem(where, str(exc), exc.line, file=where)
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError) as exc:
        line, reason = syntax_problem(exc, text)
        return LoadProblem(where, reason, line, file=where)


def _entries(where: str, data: Any, root: yaml.Node | None) -> list[_Entry] | LoadProblem:
    """The file's skill entries: the one skill, or each of its ``skills:`` list."""
    if isinstance(data, dict) and set(data) == {"skills"}:
        items = data["skills"]
        if not isinstance(items, list):
            line = line_of(root, ("skills",))
            return LoadProblem(where, "'skills' must be a list of skills", line, file=where)
        nodes = _item_nodes(root, len(items))
        return [(f"{where}[{i}]", item, nodes[i]) for i, item in enumerate(items)]
    if isinstance(data, dict):
        return [(where, data, root)]
    if data is None:
        return LoadProblem(where, _EMPTY, file=where)
    return LoadProblem(where, _NOT_A_MAPPING, line_of(root, ()), file=where)


def _validated(
    entries: list[_Entry], folder: Path, where: str
) -> tuple[list[LoadedSkill], list[LoadProblem]]:
    """Each entry as a ``Skill``, or its problems, each on its line."""
    skills: list[LoadedSkill] = []
    problems: list[LoadProblem] = []
    for label, item, node in entries:
        if not isinstance(item, dict):
            problems.append(
                LoadProblem(label, "a skill must be a mapping", line_of(node, ()), file=where)
            )
            continue
        try:
            # Its tools resolve modules and relative command paths against the file's folder.
            skill = Skill.model_validate(item, context={SKILL_FOLDER_CONTEXT: folder})
            skills.append(LoadedSkill(skill, label, where, line_of(node, ())))
        except ValidationError as exc:
            name = item.get("name")
            problems.extend(
                LoadProblem(label, reason, line, name if isinstance(name, str) else None, where)
                for line, reason in entry_problems(exc, item, node)
            )
    return skills, problems


_EMPTY = "the file is empty; a skill file holds one skill, or a list of skills under 'skills:'"
_NOT_A_MAPPING = "a skill file holds a mapping (one skill or 'skills:')"
