"""The ``cleveragents`` command group, its lazy subcommands and its error handling.

Each subcommand's module is imported when that command runs (or its own ``--help``
is asked), not before: ``cleveragents --help`` lists them from ``COMMANDS``, so that
a command that needs none of Celery, kombu, redis-py, pydantic or rich does not load
them (an agent that shells out to the CLI pays the start on every call). This is
click's lazy-group pattern (``get_command`` and ``list_commands`` of a ``Group``
subclass); ``tests/cli/test_light_start.py`` checks that the table says what each
command's own docstring says.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from typing import Any, NamedTuple

import click

from cleveragents import __version__
from cleveragents.errors import CleverAgentsError

__all__ = ["COMMANDS", "LazyCommand", "LazyGroup", "cli", "main"]


class LazyCommand(NamedTuple):
    """Where a subcommand is defined, and the first paragraph of its help (for listing)."""

    module: str
    attribute: str
    help: str


class LazyGroup(click.Group):
    """A ``click.Group`` whose ``lazy`` subcommands are imported on first use."""

    def __init__(self, *args: Any, lazy: Mapping[str, LazyCommand] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.lazy: dict[str, LazyCommand] = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Every subcommand's name, imported or not."""
        return sorted(set(super().list_commands(ctx)) | set(self.lazy))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The subcommand, imported now if it was not yet."""
        where = self.lazy.get(cmd_name)
        if where is not None and cmd_name not in self.commands:
            command = getattr(importlib.import_module(where.module), where.attribute)
            if not isinstance(command, click.Command):
                raise TypeError(f"{where.module}.{where.attribute} is not a click command")
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """List the subcommands as click does, from ``lazy`` for those not imported."""
        rows: list[tuple[str, click.Command]] = []
        for name in self.list_commands(ctx):
            command = self.commands.get(name)
            if command is None:
                command = click.Command(name, help=self.lazy[name].help)
            if not command.hidden:
                rows.append((name, command))
        if not rows:
            return
        limit = formatter.width - 6 - max(len(name) for name, _ in rows)
        with formatter.section("Commands"):
            formatter.write_dl([(name, c.get_short_help_str(limit)) for name, c in rows])


#: The subcommands: name -> where it is defined, and what ``cleveragents --help`` says of it.
COMMANDS: dict[str, LazyCommand] = {
    "approvals": LazyCommand(
        "cleveragents.cli.approvals_cmd",
        "approvals",
        "Invocations that wait for a person's approval (docs/approvals.md).",
    ),
    "audit": LazyCommand(
        "cleveragents.cli.approvals_cmd",
        "audit",
        "The audit trail of writes, oldest first: never an argument value.",
    ),
    "batch": LazyCommand(
        "cleveragents.cli.batch_cmd",
        "batch",
        "Run many invocations from a JSONL file (one request a line).",
    ),
    "mcp": LazyCommand(
        "cleveragents.cli.mcp_cmd",
        "mcp",
        "Serve the catalogue to MCP hosts: agents call the fleet over MCP.",
    ),
    "metrics": LazyCommand(
        "cleveragents.cli.metrics_cmd",
        "metrics",
        "Export queue lengths, oldest waiting ages, invocations and durations for Prometheus.",
    ),
    "result": LazyCommand(
        "cleveragents.cli.submit_cmd",
        "result",
        "Print the result of one invocation (exit 1 if it failed or is not there yet).",
    ),
    "skills": LazyCommand(
        "cleveragents.cli.skills_cmd",
        "skills",
        "Inspect the skill catalogue (CLEVERAGENTS_CATALOGUE, or the bundled examples).",
    ),
    "submit": LazyCommand(
        "cleveragents.cli.submit_cmd",
        "submit",
        "Enqueue one invocation of SKILL's TOOL; print its id, or with --wait its result.",
    ),
    "worker": LazyCommand(
        "cleveragents.cli.worker_cmd",
        "worker",
        "Start a worker; every option is passed to `celery -A cleveragents.worker worker`.",
    ),
}


@click.group(cls=LazyGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="cleveragents")
def cli() -> None:
    """Run AI agents' tool calls in the background on Celery workers."""


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; every error is one line on stderr and an exit code (0, 1 or 2)."""
    try:
        # Without standalone mode click returns a command's Exit code instead of raising it.
        code = cli.main(args=argv, prog_name="cleveragents", standalone_mode=False)
    except click.exceptions.Exit as done:
        return done.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
        return 130
    except CleverAgentsError as exc:
        click.echo(f"error: {exc}", err=True)
        code = getattr(exc, "exit_code", 2)  # bad input 2; a server that cannot run 1
        return code if isinstance(code, int) else 2
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # a bug or an unexpected environment: still one line, no traceback
        click.echo(f"error: {type(exc).__name__}: {exc}", err=True)
        return 1
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
