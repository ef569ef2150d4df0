"""``cleveragents worker``: the same as ``celery -A worker worker``."""

from __future__ import annotations

import os
import sys

import click

from cleveragents.embedded.runner import worker_command

__all__ = ["worker"]


@click.command(
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    add_help_option=False,
)
@click.argument("celery_options", nargs=-1, type=click.UNPROCESSED)
def worker(celery_options: tuple[str, ...]) -> None:
    """Start a worker; every option is passed to `celery -A worker worker`."""
    command = worker_command(*celery_options)
    sys.stdout.flush()
    os.execv(command[0], command)
