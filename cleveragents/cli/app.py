"""The ``cleveragents`` command group and its error handling."""

from __future__ import annotations

import sys

import click

from cleveragents import __version__
from cleveragents.cli.approvals_cmd import approvals, audit
from cleveragents.cli.batch_cmd import batch
from cleveragents.cli.mcp_cmd import mcp, skills_import
from cleveragents.cli.metrics_cmd import metrics
from cleveragents.cli.skills_cmd import skills
from cleveragents.cli.submit_cmd import result, submit
from cleveragents.cli.worker_cmd import worker
from cleveragents.errors import CleverAgentsError

__all__ = ["cli", "main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="cleveragents")
def cli() -> None:
    """Run AI agents' tool calls in the background on Celery workers."""


cli.add_command(skills)
cli.add_command(submit)
cli.add_command(result)
cli.add_command(worker)
cli.add_command(batch)
cli.add_command(metrics)
cli.add_command(mcp)
cli.add_command(approvals)
cli.add_command(audit)
skills.add_command(skills_import)


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
        return 2
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
