"""``cleveragents skills export --format mcp``: MCP tool definitions of a catalogue."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from textwrap import dedent
from typing import Any

import jsonschema_rs
import pytest

from cleveragents.runtime import invoke
from cleveragents.skills import Catalogue
from cleveragents.skills import mcp_tools as mcp_module
from cleveragents.skills.mcp_tools import (
    MAX_NAME_LENGTH,
    NAME_RE,
    export_catalogue,
    mcp_tool_name,
)

_REPO = Path(__file__).resolve().parents[2]
_EXAMPLES = _REPO / "examples" / "skills"

#: MCP's tool-name rule (2025-11-25 "Tool names"; 2025-06-18 leaves the string free).
MCP_NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,128}$"
#: A valid ``_meta`` key: optional dotted-label prefix and a slash, then a name.
_LABEL = r"[a-zA-Z]([a-zA-Z0-9-]*[a-zA-Z0-9])?"
META_KEY_PATTERN = rf"^({_LABEL}(\.{_LABEL})*/)?[a-zA-Z0-9]([a-zA-Z0-9._-]*[a-zA-Z0-9])?$"

_OBJECT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["type"],
    "properties": {
        "type": {"const": "object"},
        "properties": {"type": "object", "additionalProperties": {"type": ["object", "boolean"]}},
        "required": {"type": "array", "items": {"type": "string"}},
    },
}

#: The ``Tool`` type of the MCP specification (2025-06-18, schema.ts), as a JSON Schema.
MCP_TOOL_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["name", "inputSchema"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "pattern": MCP_NAME_PATTERN},
        "title": {"type": "string"},
        "description": {"type": "string"},
        "inputSchema": _OBJECT_SCHEMA,
        "outputSchema": _OBJECT_SCHEMA,
        "annotations": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "title": {"type": "string"},
                "readOnlyHint": {"type": "boolean"},
                "destructiveHint": {"type": "boolean"},
                "idempotentHint": {"type": "boolean"},
                "openWorldHint": {"type": "boolean"},
            },
        },
        "_meta": {
            "type": "object",
            "propertyNames": {
                "pattern": META_KEY_PATTERN,
                # Prefixes with modelcontextprotocol / mcp labels are reserved.
                "not": {"pattern": r"(^|\.)(modelcontextprotocol|mcp)(\.|/)"},
            },
        },
    },
}
_TOOL_VALIDATOR = jsonschema_rs.validator_for(MCP_TOOL_SCHEMA)


def _console_script() -> list[str]:
    script = Path(sys.executable).parent / "cleveragents"
    if script.exists():
        return [str(script)]
    found = shutil.which("cleveragents")
    return [found] if found else [sys.executable, "-m", "cleveragents"]


def _run(*args: str, catalogue: str | Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLEVERAGENTS_")}
    if catalogue is not None:
        env["CLEVERAGENTS_CATALOGUE"] = str(catalogue)
    return subprocess.run(
        [*_console_script(), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=_REPO,
        timeout=60,
        check=False,
    )


def _export(*args: str, catalogue: str | Path | None = None) -> list[dict[str, Any]]:
    done = _run("skills", "export", "--format", "mcp", *args, catalogue=catalogue)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert set(document) == {"tools"}
    tools: list[dict[str, Any]] = document["tools"]
    return tools


def _assert_valid_mcp_tools(tools: list[dict[str, Any]]) -> None:
    for tool in tools:
        errors = [str(e) for e in _TOOL_VALIDATOR.iter_errors(tool)]
        assert errors == [], f"{tool.get('name')}: {errors}"
        # Every schema we emit is itself a valid JSON Schema.
        jsonschema_rs.validator_for(tool["inputSchema"])
        if "outputSchema" in tool:
            jsonschema_rs.validator_for(tool["outputSchema"])
        assert NAME_RE.match(tool["name"]), tool["name"]
    names = [t["name"] for t in tools]
    assert len(names) == len(set(names)), "MCP tool names must be unique within a server"


def _write(folder: Path, relative: str, text: str) -> Path:
    path = folder / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dedent(text).lstrip(), encoding="utf-8")
    return path


@pytest.fixture
def flags_catalogue(tmp_path: Path) -> Path:
    """One skill with a read-only, a writing, a side-effect, a both and an idempotent writer."""
    folder = tmp_path / "catalogue"
    _write(
        folder,
        "flags.yaml",
        """
        name: test/flags
        description: one tool of each kind
        version: 3.1
        tools:
          - {name: test/read, source: python, entrypoint: cleveragents.examples.tools:echo,
             description: reads}
          - {name: test/write, source: python, writes: true,
             entrypoint: cleveragents.examples.tools:echo}
          - {name: test/notify, source: command, command: [python3, -c, "print(1)"],
             side_effects: true}
          - {name: test/both, source: python, entrypoint: cleveragents.examples.tools:echo,
             writes: true, side_effects: true}
          - {name: test/put, source: python, entrypoint: cleveragents.examples.tools:echo,
             writes: true, idempotent: true}
          - {name: test/count, source: python, entrypoint: cleveragents.examples.tools:echo,
             idempotent: true}
        """,
    )
    return folder


# --------------------------------------------------------------------------- examples


def test_the_example_catalogue_exports_valid_mcp_tools() -> None:
    tools = _export(catalogue=_EXAMPLES)
    assert tools
    _assert_valid_mcp_tools(tools)
    for tool in tools:
        assert tool["title"] == tool["annotations"]["title"]
        assert tool["description"]


def test_the_export_has_one_tool_per_skill_and_tool_pair() -> None:
    tools = _export("--catalogue", str(_EXAMPLES))
    catalogue = Catalogue.from_paths(_EXAMPLES)
    expected = [
        (name, entry.tool.name)
        for name in catalogue.names
        for entry in catalogue.resolve(name).resolved_tools
    ]
    pairs = [(t["_meta"]["cleveragents/skill"], t["_meta"]["cleveragents/tool"]) for t in tools]
    assert pairs == expected
    # local/echo is reached through every skill (a diamond at local/common): once per skill.
    echo = [t for t in tools if t["_meta"]["cleveragents/tool"] == "local/echo"]
    assert sorted(t["_meta"]["cleveragents/skill"] for t in echo) == catalogue.names
    assert {t["_meta"]["cleveragents/source_skill"] for t in echo} == {"local/common"}


def test_names_are_readable_and_encode_skill_and_tool() -> None:
    by_pair = {
        (t["_meta"]["cleveragents/skill"], t["_meta"]["cleveragents/tool"]): t
        for t in _export(catalogue=_EXAMPLES)
    }
    tool = by_pair[("local/text-tools", "local/word-count")]
    assert tool["name"] == "local_text-tools__local_word-count"
    assert tool["title"] == "local/word-count (local/text-tools)"
    assert tool["inputSchema"] == {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
    }
    assert tool["outputSchema"]["required"] == ["words"]


def test_the_skill_option_restricts_the_export_and_keeps_names() -> None:
    everything = {t["name"]: t for t in _export(catalogue=_EXAMPLES)}
    notes = _export("--skill", "local/notes", catalogue=_EXAMPLES)
    assert {t["_meta"]["cleveragents/skill"] for t in notes} == {"local/notes"}
    assert all(everything[t["name"]] == t for t in notes)
    two = _export(
        "--skill",
        "local/research",
        "--skill",
        "local/common",
        "--skill",
        "local/research",
        catalogue=_EXAMPLES,
    )
    assert two[0]["_meta"]["cleveragents/skill"] == "local/research"
    assert {t["_meta"]["cleveragents/skill"] for t in two} == {"local/research", "local/common"}
    _assert_valid_mcp_tools(two)


def test_the_exported_meta_is_what_submit_needs() -> None:
    """The skill and tool of ``_meta`` are exactly what a request names."""
    catalogue = Catalogue.from_paths(_EXAMPLES)
    tools = _export(catalogue=_EXAMPLES)
    word_count = next(t for t in tools if t["name"] == "local_research__local_word-count")
    meta = word_count["_meta"]
    result = invoke(
        {
            "skill": meta["cleveragents/skill"],
            "tool": meta["cleveragents/tool"],
            "arguments": {"text": "one two three"},
        },
        catalogue,
    )
    assert result.success, result.error
    assert result.output_data == {"words": 3}
    assert jsonschema_rs.validator_for(word_count["outputSchema"]).is_valid(result.output_data)
    assert meta["cleveragents/requires_allow_writes"] is False
    write = next(t for t in tools if t["name"] == "local_notes__local_write-note")
    assert write["_meta"]["cleveragents/requires_allow_writes"] is True


# --------------------------------------------------------------------------- hints


def test_hints_follow_the_tool_flags(flags_catalogue: Path) -> None:
    tools = _export("--catalogue", str(flags_catalogue))
    _assert_valid_mcp_tools(tools)
    hints = {
        t["_meta"]["cleveragents/tool"]: {k: v for k, v in t["annotations"].items() if k != "title"}
        for t in tools
    }
    assert hints == {
        "test/read": {
            "readOnlyHint": True,
            "destructiveHint": False,
            "idempotentHint": False,
            "openWorldHint": False,
        },
        "test/count": {
            "readOnlyHint": True,
            "destructiveHint": False,
            "idempotentHint": True,
            "openWorldHint": False,
        },
        "test/write": {
            "readOnlyHint": False,
            "destructiveHint": True,
            "idempotentHint": False,
            "openWorldHint": False,
        },
        "test/put": {
            "readOnlyHint": False,
            "destructiveHint": True,
            "idempotentHint": True,
            "openWorldHint": False,
        },
        # Side effects only: not read-only, open world, and destructive (MCP's default
        # for a tool that is not read-only; the catalogue cannot say "additive only").
        "test/notify": {
            "readOnlyHint": False,
            "destructiveHint": True,
            "idempotentHint": False,
            "openWorldHint": True,
        },
        "test/both": {
            "readOnlyHint": False,
            "destructiveHint": True,
            "idempotentHint": False,
            "openWorldHint": True,
        },
    }


def test_meta_carries_the_flags_and_version(flags_catalogue: Path) -> None:
    tools = {t["_meta"]["cleveragents/tool"]: t for t in _export(catalogue=flags_catalogue)}
    notify = tools["test/notify"]["_meta"]
    assert notify["cleveragents/skill_version"] == "3.1"
    assert notify["cleveragents/source"] == "command"
    assert (notify["cleveragents/writes"], notify["cleveragents/side_effects"]) == (False, True)
    assert notify["cleveragents/requires_allow_writes"] is True
    assert tools["test/read"]["description"] == "reads"
    assert tools["test/write"]["description"] == "Tool test/write of skill test/flags."
    # No schema anywhere: the arguments are "any object".
    assert tools["test/read"]["inputSchema"] == {"type": "object"}
    assert "outputSchema" not in tools["test/read"]


# --------------------------------------------------------------------------- schemas


def test_schemas_fall_back_to_the_skill_and_only_object_outputs_are_kept(
    tmp_path: Path,
) -> None:
    _write(
        tmp_path,
        "schemas.yaml",
        """
        name: test/schemas
        input_schema: {type: object, properties: {q: {type: string}}}
        output_schema: {type: object, properties: {r: {type: integer}}}
        tools:
          - {name: test/inherits, source: python, entrypoint: cleveragents.examples.tools:echo}
          - name: test/own
            source: python
            entrypoint: cleveragents.examples.tools:echo
            input_schema: {type: object, properties: {text: {type: string}}}
            output_schema: {type: array}
          - name: test/untyped
            source: python
            entrypoint: cleveragents.examples.tools:echo
            input_schema: {properties: {n: {type: integer}}}
            output_schema: {type: [object, "null"]}
          - name: test/either
            source: python
            entrypoint: cleveragents.examples.tools:echo
            input_schema: {type: [object, "null"], required: [n]}
          - name: test/never
            source: python
            entrypoint: cleveragents.examples.tools:echo
            input_schema: {type: string}
        """,
    )
    done = _run("skills", "export", "--format", "mcp", "--catalogue", str(tmp_path))
    assert done.returncode == 0, done.stderr
    tools = {t["_meta"]["cleveragents/tool"]: t for t in json.loads(done.stdout)["tools"]}
    _assert_valid_mcp_tools(list(tools.values()))
    assert tools["test/inherits"]["inputSchema"]["properties"] == {"q": {"type": "string"}}
    assert tools["test/inherits"]["outputSchema"]["properties"] == {"r": {"type": "integer"}}
    assert tools["test/own"]["inputSchema"]["properties"] == {"text": {"type": "string"}}
    assert "outputSchema" not in tools["test/own"]  # the tool's own schema is not an object
    assert tools["test/untyped"]["inputSchema"] == {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
    }
    assert "outputSchema" not in tools["test/untyped"]
    assert tools["test/either"]["inputSchema"] == {"type": "object", "required": ["n"]}
    # A tool whose input schema accepts no object can never be called: left out, with a warning.
    assert "test/never" not in tools
    assert "warning" in done.stderr
    assert "test/never" in done.stderr


def test_the_export_does_not_share_schema_objects_with_the_catalogue() -> None:
    catalogue = Catalogue.from_paths(_EXAMPLES)
    exported = export_catalogue(catalogue, ["local/common"])
    exported.tools[0]["inputSchema"]["properties"]["text"]["type"] = "integer"
    echo = catalogue.resolve("local/common").resolved_tools[0].tool
    assert echo.input_schema is not None
    assert echo.input_schema["properties"]["text"]["type"] == "string"


# --------------------------------------------------------------------------- names


def test_tool_names_are_deterministic_valid_and_short() -> None:
    assert mcp_tool_name("local/text-tools", "local/word-count") == (
        "local_text-tools__local_word-count"
    )
    assert mcp_tool_name("a/b", "c/d") == mcp_tool_name("a/b", "c/d")
    # '.' and '_' stay readable: names are never read back, so they need no digest
    assert mcp_tool_name("ext/filesystem", "ext/write_file") == "ext_filesystem__ext_write_file"
    assert mcp_tool_name("org.team/x", "ns/y_z") == "org_team_x__ns_y_z"
    # a digest is asked for only where two pairs would share a name (export_definitions)
    dotted = mcp_tool_name("org.team/x", "ns/y_z", digest_len=8)
    assert re.fullmatch(r"org_team_x__ns_y_z-[0-9a-f]{8}", dotted)
    assert mcp_tool_name("org/team_x", "ns/y.z", digest_len=8) != dotted
    long_name = mcp_tool_name("ns/" + "s" * 80, "ns/" + "t" * 80)
    assert len(long_name) == MAX_NAME_LENGTH
    assert NAME_RE.match(long_name)
    assert long_name != mcp_tool_name("ns/" + "s" * 80, "ns/" + "t" * 81)


def test_names_stay_unique_when_digests_clash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(
        tmp_path,
        "clash.yaml",
        """
        skills:
          - name: org/a.b
            tools: [{name: ns/t, source: python, entrypoint: cleveragents.examples.tools:echo}]
          - name: org/a_b
            tools: [{name: ns/t, source: python, entrypoint: cleveragents.examples.tools:echo}]
        """,
    )
    real = mcp_module._digest
    # Force the short digests to clash; the export falls back to longer ones.
    monkeypatch.setattr(mcp_module, "_digest", lambda s, t, n: "0" * n if n == 8 else real(s, t, n))
    exported = export_catalogue(Catalogue.from_paths(tmp_path))
    names = [t["name"] for t in exported.tools]
    assert len(names) == 2
    assert len(set(names)) == 2
    assert all(re.fullmatch(r"org_a_b__ns_t-[0-9a-f]{16}", n) for n in names)
    _assert_valid_mcp_tools(exported.tools)


def test_snake_case_tools_are_served_readable_a_real_clash_gets_digests_and_a_skill_names_its_own(
    tmp_path: Path,
) -> None:
    _write(
        tmp_path,
        "names.yaml",
        """
        skills:
          - name: ext/filesystem
            tools:
              - {name: ext/write_file, source: python, entrypoint: cleveragents.examples.tools:echo}
              - {name: ext/read_file, source: python, entrypoint: cleveragents.examples.tools:echo,
                 mcp_name: read_file}
          - name: org/a.b
            tools: [{name: ns/t, source: python, entrypoint: cleveragents.examples.tools:echo}]
          - name: org/a_b
            tools: [{name: ns/t, source: python, entrypoint: cleveragents.examples.tools:echo}]
        """,
    )
    exported = export_catalogue(Catalogue.from_paths(tmp_path))
    names = sorted(t["name"] for t in exported.tools)
    # A snake_case tool keeps its name, no digest; one the skill names is served so
    assert "ext_filesystem__ext_write_file" in names
    assert "read_file" in names
    # Two pairs that would share a name both get a digest, the same whatever else is there
    clashed = [n for n in names if n.startswith("org_a_b__ns_t")]
    assert len(clashed) == 2
    assert all(re.fullmatch(r"org_a_b__ns_t-[0-9a-f]{8}", n) for n in clashed)
    _assert_valid_mcp_tools(exported.tools)


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--format", "openai"), "openai"),
        (("--format", "mcp", "--skill", "ops/bicycle"), "ops/bicycle"),
        (("--format", "mcp", "--catalogue", "/no/such/path"), "/no/such/path"),
    ],
)
def test_bad_usage_is_one_error_line_and_exit_2(args: tuple[str, ...], needle: str) -> None:
    done = _run("skills", "export", *args, catalogue=_EXAMPLES)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error:")
    assert needle in lines[0]
    assert done.stdout == ""


def test_a_missing_format_is_a_usage_error() -> None:
    done = _run("skills", "export", catalogue=_EXAMPLES)
    assert done.returncode == 2
    assert "--format" in done.stderr
    assert "Traceback" not in done.stderr


def test_an_unresolvable_skill_exits_1_and_others_still_export(tmp_path: Path) -> None:
    _write(
        tmp_path,
        "cycle.yaml",
        """
        skills:
          - {name: local/a, includes: [local/b]}
          - name: local/b
            includes: [local/a]
          - name: local/fine
            tools: [{name: local/t, source: python, entrypoint: cleveragents.examples.tools:echo}]
        """,
    )
    done = _run("skills", "export", "--format", "mcp", "--skill", "local/a", catalogue=tmp_path)
    assert done.returncode == 1
    assert "cycle_detected" in done.stderr
    assert done.stdout == ""

    whole = _run("skills", "export", "--format", "mcp", catalogue=tmp_path)
    assert whole.returncode == 0
    assert "warning" in whole.stderr  # the cycle, reported as for `skills list`
    tools = json.loads(whole.stdout)["tools"]
    assert [t["name"] for t in tools] == ["local_fine__local_t"]
