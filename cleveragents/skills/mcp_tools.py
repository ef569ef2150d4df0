"""Export a catalogue's tools as MCP tool definitions (``tools/list``, MCP 2025-06-18).

Pure data in, data out: no printing and no CLI (``cleveragents skills export
--format mcp`` wraps it). One MCP tool is produced per (skill, tool) pair: an
agent platform submits ``cleveragents submit SKILL TOOL``, so each definition
must say which skill it runs through, and one tool reached through two skills
runs under two different sets of gates and schemas.

Decisions (see docs/skills.md, "Exporting to MCP"):

- **Names.** ``<skill>__<tool>`` with ``/`` and ``.`` written as ``_``, so that
  names stay within ``[A-Za-z0-9_-]{1,64}``: valid MCP names (which allow
  ``[A-Za-z0-9_.-]{1,128}``) that are also accepted by the LLM APIs and clients
  that reject dots or names over 64 characters. The mapping is deterministic;
  when it would be ambiguous (an original name holds ``_`` or ``.``) or too long,
  8 hex digits of a SHA-256 of the two original names are appended. The
  original names are always in ``_meta`` (``cleveragents/skill``,
  ``cleveragents/tool``) and in ``title``.
- **Hints.** ``readOnlyHint`` is neither ``writes`` nor ``side_effects``;
  ``destructiveHint`` is true for every write-capable tool (``writes`` or
  ``side_effects``): the catalogue cannot say that a tool only adds, and MCP's
  own default for a tool that is not read-only is destructive, so we never
  claim "additive only" for a tool whose author did not; ``idempotentHint`` is
  ``idempotent``; ``openWorldHint`` is ``side_effects``.
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cleveragents.skills.catalogue import Catalogue
from cleveragents.skills.model import ResolvedToolEntry, ToolSpec
from cleveragents.skills.protocol import SkillDefinition

__all__ = [
    "MAX_NAME_LENGTH",
    "MCP_PROTOCOL_VERSION",
    "META_PREFIX",
    "NAME_RE",
    "McpExport",
    "export_catalogue",
    "export_definitions",
    "mcp_tool",
    "mcp_tool_name",
    "served_name",
]

#: The MCP revision whose ``Tool`` type the export follows.
MCP_PROTOCOL_VERSION = "2025-06-18"
#: Prefix of our ``_meta`` keys (a valid MCP ``_meta`` prefix: one label and a slash).
META_PREFIX = "cleveragents/"
#: Longest name produced: MCP allows 128, common LLM tool-calling APIs 64.
MAX_NAME_LENGTH = 64
#: What every produced name matches.
NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

_SEPARATOR = "__"
_DIGEST_LEN = 8
_LONG_DIGEST_LEN = 16
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def _part(name: str) -> str:
    return _UNSAFE.sub("_", name)


def _digest(skill: str, tool: str, length: int) -> str:
    return hashlib.sha256(f"{skill}\n{tool}".encode()).hexdigest()[:length]


def mcp_tool_name(skill: str, tool: str, *, digest_len: int = 0) -> str:
    """The MCP name of ``tool`` reached through ``skill``: deterministic, ``[A-Za-z0-9_-]{1,64}``.

    ``local/text-tools`` + ``local/word-count`` gives ``local_text-tools__local_word-count``,
    and ``ext/filesystem`` + ``ext/write_file`` gives ``ext_filesystem__ext_write_file``:
    readable, and what a client that looks for ``write_file`` finds. The name is not
    read back (the server keeps a table from names to pairs), so ``_`` and ``.`` need
    no digest. A digest of both names is appended only when the name would be longer
    than 64 characters, or (``digest_len``) when two pairs would share it.
    """
    readable = f"{_part(skill)}{_SEPARATOR}{_part(tool)}"
    if not digest_len and len(readable) <= MAX_NAME_LENGTH:
        return readable
    suffix = "-" + _digest(skill, tool, digest_len or _DIGEST_LEN)
    return readable[: MAX_NAME_LENGTH - len(suffix)] + suffix


def served_name(skill: str, tool: ToolSpec) -> str:
    """The name ``tool`` is served under through ``skill``: its ``mcp_name`` when the
    skill file sets one, else ``mcp_tool_name``."""
    return tool.mcp_name or mcp_tool_name(skill, tool.name)


def _schema_type(schema: dict[str, Any]) -> str | list[Any] | None:
    declared = schema.get("type")
    if isinstance(declared, str | list):
        return declared
    return None


def _input_schema(entry: ResolvedToolEntry, definition: SkillDefinition) -> dict[str, Any] | None:
    """The tool's input schema, else the skill's, else ``{"type": "object"}``; typed ``object``.

    Arguments are always a JSON object, so a schema without a type, or one that
    allows ``object`` among other types, is narrowed to ``"type": "object"``
    (it accepts exactly the same arguments). ``None`` when the schema accepts no
    object at all: no invocation of that tool can pass validation.
    """
    chosen = entry.tool.input_schema
    if chosen is None:
        chosen = definition.input_schema
    if chosen is None:
        return {"type": "object"}
    declared = _schema_type(chosen)
    schema = copy.deepcopy(chosen)
    if declared == "object":
        return schema
    if declared is None and "type" not in chosen:
        return {"type": "object", **schema}
    if isinstance(declared, list) and "object" in declared:
        schema["type"] = "object"
        return schema
    return None


def _output_schema(entry: ResolvedToolEntry, definition: SkillDefinition) -> dict[str, Any] | None:
    """The tool's output schema, else the skill's, when it is exactly ``type: object``.

    MCP requires ``outputSchema`` to be an object schema, and a server that
    declares one must return structured content that conforms; an output that
    may be something else (``[object, "null"]``, an array) gets no outputSchema.
    """
    chosen = entry.tool.output_schema
    if chosen is None:
        chosen = definition.output_schema
    if chosen is None or _schema_type(chosen) != "object":
        return None
    return copy.deepcopy(chosen)


def mcp_tool(
    definition: SkillDefinition, entry: ResolvedToolEntry, *, name: str | None = None
) -> dict[str, Any] | None:
    """One MCP ``Tool`` object for ``entry`` reached through ``definition``'s skill.

    ``None`` when the tool's input schema accepts no JSON object (see
    ``_input_schema``): such a tool cannot be called with any arguments.
    """
    tool = entry.tool
    skill = definition.skill
    input_schema = _input_schema(entry, definition)
    if input_schema is None:
        return None
    title = f"{tool.name} ({skill.name})"
    description = tool.description or f"Tool {tool.name} of skill {skill.name}."
    result: dict[str, Any] = {
        "name": name or mcp_tool_name(skill.name, tool.name),
        "title": title,
        "description": description,
        "inputSchema": input_schema,
    }
    output_schema = _output_schema(entry, definition)
    if output_schema is not None:
        result["outputSchema"] = output_schema
    result["annotations"] = {
        "title": title,
        "readOnlyHint": not tool.write_capable,
        "destructiveHint": tool.write_capable,
        "idempotentHint": tool.idempotent,
        "openWorldHint": tool.side_effects,
    }
    result["_meta"] = {
        f"{META_PREFIX}skill": skill.name,
        f"{META_PREFIX}tool": tool.name,
        f"{META_PREFIX}skill_version": skill.version,
        f"{META_PREFIX}source_skill": entry.source_skill,
        f"{META_PREFIX}source": tool.source,
        f"{META_PREFIX}writes": tool.writes,
        f"{META_PREFIX}side_effects": tool.side_effects,
        f"{META_PREFIX}requires_allow_writes": tool.write_capable,
        f"{META_PREFIX}timeout_s": tool.timeout_s,
    }
    return result


@dataclass(frozen=True)
class McpExport:
    """The result of an export: the MCP tools, and the pairs left out, with why."""

    tools: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def document(self) -> dict[str, Any]:
        """The JSON document the CLI prints: ``{"tools": [...]}`` (a ``tools/list`` result)."""
        return {"tools": self.tools}


def export_definitions(definitions: Iterable[SkillDefinition]) -> McpExport:
    """MCP tools for every (skill, tool) pair of ``definitions``, in order.

    Skills in the order given (each once), tools in resolution order. Names are
    unique within the export: should two pairs still map to one name (only
    possible with contrived names), both get a 16-digit digest instead; a clash
    after that raises ``ValueError``.
    """
    pairs: list[tuple[SkillDefinition, ResolvedToolEntry]] = []
    seen_skills: set[str] = set()
    for definition in definitions:
        if definition.skill.name in seen_skills:
            continue
        seen_skills.add(definition.skill.name)
        pairs.extend((definition, entry) for entry in definition.resolved_tools)

    names = [served_name(d.skill.name, e.tool) for d, e in pairs]
    # Only pairs that would really share a name get a digest (of both of their names:
    # the same whatever else the catalogue holds); a longer one if digests still clash.
    for digest_len in (_DIGEST_LEN, _LONG_DIGEST_LEN):
        shared = {name for name in names if names.count(name) > 1}
        names = [
            mcp_tool_name(d.skill.name, e.tool.name, digest_len=digest_len)
            if name in shared
            else name
            for name, (d, e) in zip(names, pairs, strict=True)
        ]
    if len(set(names)) != len(names):
        raise ValueError("two (skill, tool) pairs map to one MCP tool name")

    tools: list[dict[str, Any]] = []
    skipped: list[str] = []
    for name, (definition, entry) in zip(names, pairs, strict=True):
        exported = mcp_tool(definition, entry, name=name)
        if exported is None:
            skipped.append(
                f"{definition.skill.name} {entry.tool.name}: its input schema accepts no "
                "JSON object, so it cannot be called"
            )
            continue
        tools.append(exported)
    return McpExport(tools=tools, skipped=skipped)


def export_catalogue(catalogue: Catalogue, skills: Sequence[str] = ()) -> McpExport:
    """MCP tools of ``skills`` (all that resolve, by name, when empty) of ``catalogue``.

    Raises:
        SkillNotFoundError: a named skill is not in the catalogue.
        SkillResolutionError: a named skill is there but does not resolve.
    """
    names = list(skills) if skills else catalogue.names
    return export_definitions(catalogue.resolve(name) for name in names)
