"""What is wrong with a skill file, in plain words, and on which line.

The loader parses a file once into data *and* its YAML node tree; the nodes keep
the line each key and item starts on. A problem is then a ``(line, text)`` pair:
a YAML or JSON syntax error at the parser's mark, or each of pydantic's errors
at the line of the key it names, with the closest valid key for an unknown one
(``write`` -> ``writes``).
"""

from __future__ import annotations

import difflib
import json
import typing
from collections.abc import Sequence
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from cleveragents.skills import tool_kinds
from cleveragents.skills.model import Skill, ToolSpec

__all__ = ["Located", "entry_problems", "line_of", "syntax_problem"]

#: A problem's line (1-based; None when unknown) and what is wrong.
Located = tuple[int | None, str]

#: Parser messages (libyaml's and PyYAML's wording) and what they mean to an author.
_YAML_PLAIN: Sequence[tuple[str, str]] = (
    (
        "mapping values are not allowed",
        "a second ':' on one line; put each 'key: value' on "
        "a line of its own, or quote a value that holds ': '",
    ),
    ("tab", "a tab character; YAML indents with spaces only"),
    ("',' or ']'", "a '[' list that is not closed (a missing ']' or ',')"),
    ("',' or '}'", "a '{' mapping that is not closed (a missing '}' or ',')"),
    ("end of stream", "a quoted text that is not closed (a missing quote)"),
    ("expected '-' indicator", "a key where a list item ('- ...') belongs; check the indentation"),
    ("but found '?'", "a key where a list item ('- ...') belongs; check the indentation"),
    (
        "did not find expected key",
        "something other than a key where a key belongs; check the indentation",
    ),
    ("but found '-'", "a list item where a key belongs; check the indentation"),
    (
        "could not find expected ':'",
        "a line that is neither 'key: value' nor a list item (a missing ':'?)",
    ),
    ("undefined alias", "an alias (*name) without an anchor (&name) before it"),
    ("cannot start any token", "a character that cannot start a value; quote the value"),
    ("could not determine a constructor", "a YAML tag (!!...) that skill files do not allow"),
)


def syntax_problem(exc: Exception, text: str = "") -> Located:
    """A file that does not parse: where, and what is wrong, without parser internals.

    ``text`` is the file's text: libyaml does not always name the character it stopped at.
    """
    if isinstance(exc, json.JSONDecodeError):
        return exc.lineno, f"JSON syntax error at column {exc.colno}: {exc.msg}"
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        problem = exc.problem or "not valid YAML"
        if _char_at(text, mark.line, mark.column) == "\t":
            problem = "tab"
        plain = next((text for key, text in _YAML_PLAIN if key in problem), problem)
        text = f"YAML syntax error at column {mark.column + 1}: {plain}"
        start = exc.context_mark
        if start is not None and start.line != mark.line:
            text += f" (in what starts on line {start.line + 1})"
        return mark.line + 1, text
    if isinstance(exc, UnicodeDecodeError):
        return None, f"not UTF-8 text (byte {exc.start} cannot be read)"
    if isinstance(exc, OSError):
        return None, f"cannot read the file: {exc.strerror or exc}"
    return None, "cannot parse: " + str(exc).replace("\n", " ")


def _char_at(text: str, line: int, column: int) -> str:
    lines = text.splitlines()
    return lines[line][column : column + 1] if 0 <= line < len(lines) else ""


def line_of(node: yaml.Node | None, loc: Sequence[int | str]) -> int | None:
    """The line of the deepest key or item of ``loc`` found under ``node``.

    A key's own line, not its value's: ``tools:`` rather than the first tool.
    """
    if node is None:
        return None
    line: int = node.start_mark.line + 1
    current: yaml.Node = node
    for part in loc:
        if isinstance(current, yaml.MappingNode) and isinstance(part, str):
            pair = next(
                (
                    (k, v)
                    for k, v in current.value
                    if isinstance(k, yaml.ScalarNode) and k.value == part
                ),
                None,
            )
            if pair is None:
                break
            line = pair[0].start_mark.line + 1
            current = pair[1]
        elif isinstance(current, yaml.SequenceNode) and isinstance(part, int):
            if not 0 <= part < len(current.value):
                break
            current = current.value[part]
            line = current.start_mark.line + 1
        else:
            break
    return line


def entry_problems(
    exc: ValidationError, item: dict[str, Any], node: yaml.Node | None
) -> list[Located]:
    """Each of pydantic's errors for one skill entry, at its line, in plain words."""
    found: list[Located] = []
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        problem = (line_of(node, loc), _plain(err, loc, item))
        if problem not in found:
            found.append(problem)
    return found


def _plain(err: Any, loc: tuple[int | str, ...], item: dict[str, Any]) -> str:
    owner, fields, field = _owner(loc, item)
    message = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "extra_forbidden" and field:
        *within, key = field.split(".")
        if within:  # a key inside a mapping of its own (retry, limits, sandbox, ...)
            fields = _nested_keys(loc, fields_of=item)
            owner = f"{'.'.join(within)} of {owner}" if owner else ".".join(within)
        text = f"unknown key {key!r}" + (f" in {owner}" if owner else "")
        close = difflib.get_close_matches(key, fields, n=1, cutoff=0.6)
        if close:
            return f"{text}; did you mean {close[0]!r}?"
        return f"{text}; valid keys: {', '.join(fields)}"
    if err["type"] == "missing" and field:
        return (f"{owner}: " if owner else "") + f"missing required key {field!r}"
    if not field:
        return message  # a check of the whole skill or tool: its message names it
    return f"{field}" + (f" of {owner}" if owner else "") + f": {message}{_hint(err, field)}"


def _hint(err: Any, field: str) -> str:
    """How to write what pydantic says is of the wrong type, where a newcomer trips."""
    given = err.get("input")
    if err["type"] == "list_type" and isinstance(given, str):
        words = ", ".join(given.split()) or "..."
        return f"; write a list, e.g. {field.rsplit('.', 1)[-1]}: [{words}]"
    if err["type"] in ("bool_parsing", "bool_type"):
        return "; write true or false"
    return ""


def _nested_keys(loc: tuple[int | str, ...], fields_of: dict[str, Any]) -> list[str]:
    """The keys valid where ``loc`` points inside a tool's or a skill's own mapping."""
    model: Any = Skill
    parts = list(loc)
    if len(parts) >= 2 and parts[0] == "tools" and isinstance(parts[1], int):
        model, parts = ToolSpec, parts[2:]
    for part in parts[:-1]:
        fields = getattr(model, "model_fields", {})
        if not isinstance(part, str) or part not in fields:
            return []
        model = _model_in(fields[part].annotation)
        if model is None:
            return []
    return list(getattr(model, "model_fields", {}))


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model an annotation holds (``RetryPolicy | None`` -> RetryPolicy)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _owner(loc: tuple[int | str, ...], item: dict[str, Any]) -> tuple[str, list[str], str]:
    """Whose key ``loc`` is (``""``: the skill's), its valid keys, and the key path."""
    if len(loc) >= 2 and loc[0] == "tools" and isinstance(loc[1], int):
        tools = item.get("tools")
        tool = tools[loc[1]] if isinstance(tools, list) and loc[1] < len(tools) else None
        name = tool.get("name") if isinstance(tool, dict) else None
        owner = f"tool {name}" if isinstance(name, str) else f"tools[{loc[1]}]"
        return owner, _keys(ToolSpec, tool), ".".join(str(p) for p in loc[2:])
    return "", _keys(Skill, item), ".".join(str(p) for p in loc)


def _keys(model: type[BaseModel], data: Any) -> list[str]:
    keys = list(model.model_fields)
    source = data.get("source") if isinstance(data, dict) else None
    if model is ToolSpec and isinstance(source, str) and tool_kinds.is_known(source):
        keys += sorted(tool_kinds.option_fields(source))
    return keys
