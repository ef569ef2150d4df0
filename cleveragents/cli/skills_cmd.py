"""``cleveragents skills``: list, show, check and export catalogues."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from cleveragents.cli.app import LazyCommand, LazyGroup
from cleveragents.cli.render import CliFailure, console, err_console, print_json
from cleveragents.errors import SkillErrorType, SkillNotFoundError, SkillResolutionError
from cleveragents.runtime.kinds import load_tool_kinds
from cleveragents.runtime.validation import schema_problem
from cleveragents.settings import Settings, tool_kind_modules
from cleveragents.skills import Catalogue, CatalogueProblem, SkillDefinition
from cleveragents.skills.mcp_tools import export_catalogue

__all__ = ["skills"]


def _load(paths: tuple[str, ...], *, checking: bool = False, strict: bool = False) -> Catalogue:
    """The catalogue of ``paths``, else of CLEVERAGENTS_CATALOGUE.

    Exit 2 when no path exists (nothing could be listed: a wrong path, not an empty
    catalogue), or with ``strict`` (check, export) when any is missing. Otherwise a
    missing path is one of the catalogue's problems: a warning, and what loaded.
    """
    # Plugin kinds first: the catalogue's files may use them (a bad module: exit 2).
    load_tool_kinds(tool_kind_modules())
    chosen = paths or Settings.from_env().catalogue_paths
    missing = [p for p in chosen if not Path(p).exists()]
    if missing and (strict or len(missing) == len(chosen)):
        raise CliFailure(_missing_message(missing, given=bool(paths), checking=checking))
    return Catalogue.from_paths(*chosen)


def _missing_message(missing: list[str], *, given: bool, checking: bool) -> str:
    """One line: which catalogue path does not exist, where it came from, how to fix it."""
    shown = ", ".join(
        p if Path(p).is_absolute() else f"{p} (that is {Path(p).absolute()})" for p in missing
    )
    if not given:
        return (
            f"catalogue path does not exist: {shown}, from CLEVERAGENTS_CATALOGUE; set "
            f"CLEVERAGENTS_CATALOGUE to your skill files or folders ({os.pathsep!r}-separated), "
            "or pass --catalogue PATH"
        )
    if checking:
        return (
            f"catalogue path does not exist: {shown}; give `skills check` your skill files "
            "or folders, or none to check CLEVERAGENTS_CATALOGUE"
        )
    return (
        f"catalogue path does not exist: {shown}, given with --catalogue; point --catalogue "
        "at your skill files or folders, or leave it out to use CLEVERAGENTS_CATALOGUE"
    )


def _warn_problems(catalogue: Catalogue) -> None:
    """Each problem once, on one line (never wrapped): ``warning: file:line: reason``."""
    for problem in catalogue.errors:
        err_console.print(Text.assemble(("warning:", "yellow"), f" {problem}"), soft_wrap=True)


catalogue_option = click.option(
    "--catalogue",
    "paths",
    multiple=True,
    type=click.Path(),
    help="Skill file or folder (repeatable); defaults to CLEVERAGENTS_CATALOGUE.",
)


#: ``skills import`` is ``cli/mcp_cmd.py``'s, imported when it runs.
IMPORT = LazyCommand(
    "cleveragents.cli.mcp_cmd",
    "skills_import",
    "Print a skill file whose tools are a remote MCP server's tools.",
)


@click.group(cls=LazyGroup, lazy={"import": IMPORT})
def skills() -> None:
    """Inspect the skill catalogue (CLEVERAGENTS_CATALOGUE, or the bundled examples)."""


@skills.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON array of SkillMetadata.")
@catalogue_option
def list_skills(as_json: bool, paths: tuple[str, ...]) -> None:
    """List the skills that resolve, one row a skill."""
    catalogue = _load(paths)
    _warn_problems(catalogue)
    metadata = catalogue.list()
    if as_json:
        print_json(metadata)
        return
    table = Table(title=_count(len(metadata), "skill"), title_justify="left")
    table.add_column("name", no_wrap=True)
    for column in ("version", "tools", "writes", "sources", "description"):
        table.add_column(column)
    for meta in metadata:
        table.add_row(
            meta.name,
            meta.version,
            str(meta.tool_count),
            "yes" if meta.writes else "no",
            ",".join(meta.source_types),
            meta.description,
        )
    console.print(table)


def _show_table(definition: SkillDefinition) -> None:
    meta = definition.metadata
    console.print(f"[bold]{meta.name}[/] {meta.version}  {meta.description}")
    console.print(
        f"{meta.tool_count} tools; writes: {'yes' if meta.writes else 'no'}; "
        f"read-only: {'yes' if meta.read_only else 'no'}; includes: "
        f"{', '.join(definition.skill.includes) or '-'}"
    )
    table = Table()
    table.add_column("tool", no_wrap=True)
    for column in ("source", "access", "timeout", "from", "description"):
        table.add_column(column)
    for entry in definition.resolved_tools:
        tool = entry.tool
        access = "writes" if tool.writes else "side effects" if tool.side_effects else "read"
        table.add_row(
            tool.name,
            tool.source,
            access,
            f"{tool.timeout_s:g}s" if tool.timeout_s else "-",
            " > ".join(entry.via) or "(own)",
            tool.description,
        )
    console.print(table)


@skills.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the SkillDefinition as JSON.")
@catalogue_option
def show_skill(name: str, as_json: bool, paths: tuple[str, ...]) -> None:
    """Show one resolved skill with all its tools."""
    catalogue = _load(paths)
    try:
        definition = catalogue.resolve(name)
    except SkillNotFoundError as exc:
        raise CliFailure(
            f"{exc}; `cleveragents skills list` shows the skills that resolve", exit_code=2
        ) from None
    except SkillResolutionError as exc:
        raise CliFailure(
            f"{name} does not resolve ({exc.error_type}): {exc}", exit_code=1
        ) from None
    if as_json:
        print_json(definition)
    else:
        _show_table(definition)


def _schema_problems(catalogue: Catalogue) -> list[CatalogueProblem]:
    """Schemas that are not valid JSON Schema, in the skills that resolve.

    The runtime would only find them when the tool is first invoked.
    """
    problems: list[CatalogueProblem] = []
    for name in catalogue.names:
        skill = catalogue.resolve(name).skill
        file, line = catalogue.location(name)
        owned: list[tuple[str, dict[str, Any] | None]] = [
            ("input_schema", skill.input_schema),
            ("output_schema", skill.output_schema),
        ]
        for tool in skill.tools:
            owned.append((f"tool {tool.name} input_schema", tool.input_schema))
            owned.append((f"tool {tool.name} output_schema", tool.output_schema))
        for what, schema in owned:
            reason = schema_problem(schema) if schema is not None else None
            if reason is not None:
                problems.append(
                    CatalogueProblem(
                        name,
                        f"{what} is not a valid JSON Schema: {reason}",
                        SkillErrorType.VALIDATION_ERROR,
                        file,
                        line,
                    )
                )
    return problems


@skills.command("check")
@click.argument("paths", nargs=-1, type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the problems as one JSON object.")
def check_skills(paths: tuple[str, ...], as_json: bool) -> None:
    """Validate a catalogue; list every problem and exit 1 when there is any."""
    catalogue = _load(paths, checking=True, strict=True)
    problems = [*catalogue.errors, *_schema_problems(catalogue)]
    warnings = _policy_warnings(catalogue)
    if as_json:
        print_json(
            {
                "ok": not problems,
                "skills": catalogue.names,
                "warnings": warnings,
                "problems": [
                    {
                        "where": p.where,
                        "reason": p.reason,
                        "error_type": str(p.error_type) if p.error_type else None,
                        "file": p.file,
                        "line": p.line,
                    }
                    for p in problems
                ],
            }
        )
    else:
        for problem in problems:
            click.echo(str(problem))
        for warning in warnings:
            err_console.print(Text.assemble(("warning:", "yellow"), f" {warning}"), soft_wrap=True)
    verdict = f"{_resolved(len(catalogue))}; {_count(len(problems), 'problem')}"
    if problems:
        # A ClickException, not click's Exit: with standalone_mode=False click turns
        # Exit into a return value, which the CLI's main() does not propagate.
        raise CliFailure(verdict, exit_code=1)
    if not as_json:
        click.echo(f"{_resolved(len(catalogue))}; ok")


def _policy_warnings(catalogue: Catalogue) -> list[str]:
    """What a skill file declares that will never take effect: a ``retry`` of a write
    that is not idempotent (it keeps its at-most-once promise instead)."""
    found = []
    for name in catalogue.names:
        file, line = catalogue.location(name)
        for tool in catalogue.own_tools(name):
            policy = tool.retry
            if policy is None or policy.attempts < 2 or not tool.write_capable:
                continue
            if tool.idempotent:
                continue
            at = _tool_line(file, line, tool.name) if file else None
            where = f"{file}:{at or line}" if file and (at or line) else (file or name)
            found.append(
                f"{where}: tool {tool.name} of skill {name}: its retry (attempts: "
                f"{policy.attempts}) never applies: a write that is not idempotent runs at "
                "most once; mark it `idempotent: true` if running it twice is safe"
            )
    return found


def _tool_line(file: str, start: int | None, tool: str) -> int | None:
    """The line of ``tool``'s name in its skill's file, from the skill's own line on
    (None: not found, as in a file read some other way)."""
    try:
        lines = Path(file).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    wanted = (f"name: {tool}", f'"name": "{tool}"', f"name: '{tool}'", f'name: "{tool}"')
    for number in range(max((start or 1) - 1, 0), len(lines)):
        if any(text in lines[number] for text in wanted):
            return number + 1
    return None


#: Export formats ``skills export`` knows.
EXPORT_FORMATS = ("mcp",)


@skills.command("export")
@click.option(
    "--format",
    "fmt",
    required=True,
    metavar="[" + "|".join(EXPORT_FORMATS) + "]",
    help='mcp: one JSON object {"tools": [...]} of MCP tool definitions (MCP 2025-06-18).',
)
@catalogue_option
@click.option(
    "--skill",
    "names",
    multiple=True,
    help="Export only this skill's tools (repeatable); default: every skill that resolves.",
)
def export_skills(fmt: str, paths: tuple[str, ...], names: tuple[str, ...]) -> None:
    """Print the catalogue's tools for an agent platform: one tool per (skill, tool) pair."""
    if fmt not in EXPORT_FORMATS:
        raise CliFailure(
            f"unknown export format {fmt!r}; choose from: {', '.join(EXPORT_FORMATS)}",
            exit_code=2,
        )
    catalogue = _load(paths, strict=True)
    _warn_problems(catalogue)
    unique_names = list(dict.fromkeys(names))
    for name in unique_names:
        try:
            catalogue.resolve(name)
        except SkillNotFoundError as exc:
            raise CliFailure(str(exc), exit_code=2) from None
        except SkillResolutionError as exc:
            raise CliFailure(
                f"{name} does not resolve ({exc.error_type}): {exc}", exit_code=1
            ) from None
    exported = export_catalogue(catalogue, unique_names)
    for reason in exported.skipped:
        err_console.print(f"[yellow]warning:[/] skipped {reason}", markup=True, highlight=False)
    print_json(exported.document())


def _count(n: int, noun: str) -> str:
    """``1 skill``, ``2 skills``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _resolved(n: int) -> str:
    """``1 skill resolves``, ``3 skills resolve``."""
    return "1 skill resolves" if n == 1 else f"{n} skills resolve"
