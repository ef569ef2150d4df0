"""``cleveragents worker``: the same as ``celery -A cleveragents.worker worker``."""

from __future__ import annotations

import os
import sys

import click

from cleveragents.broker.celery_settings import celery_settings
from cleveragents.broker.signing import check_signing
from cleveragents.embedded.runner import worker_command
from cleveragents.settings import Settings

__all__ = ["worker"]


#: What ``cleveragents worker --help`` says before Celery's own help.
OUR_HELP = """Usage: cleveragents worker [OPTIONS]

  Start a worker: it takes skill invocations from the broker, runs their tools
  under the gates, and stores each SkillResult. It is `celery -A
  cleveragents.worker worker`: every Celery worker option below works here.

  Ours:
    --log-format [text|json]  every log line one JSON object with json
                              (CLEVERAGENTS_LOG_FORMAT)

  Without --loglevel it logs at INFO: one line per invocation. The broker,
  catalogue and limits come from CLEVERAGENTS_* settings (docs/configuration.md):
  CLEVERAGENTS_BROKER_URL, CLEVERAGENTS_CATALOGUE, CLEVERAGENTS_READ_ONLY, ...
  Gossip and mingle are off whatever the options say (docs/operations.md).

Celery's worker options (celery -A cleveragents.worker worker --help):
"""


@click.command(
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    add_help_option=False,
)
@click.argument("celery_options", nargs=-1, type=click.UNPROCESSED)
def worker(celery_options: tuple[str, ...]) -> None:
    """Start a worker; every option is passed to `celery -A cleveragents.worker worker`.

    `--log-format json` (ours) makes every log line one JSON object. Without
    `--loglevel` the worker logs at INFO, which includes one line per invocation.
    """
    options = list(celery_options)
    if any(o in ("--help", "-h") for o in options):
        click.echo(OUR_HELP)  # ours first; then Celery's, which holds every other option
        sys.stdout.flush()
        command = worker_command("--help")
        os.execv(command[0], command)
    for i, option in enumerate(options):
        if option == "--log-format" and i + 1 < len(options):
            os.environ["CLEVERAGENTS_LOG_FORMAT"] = options[i + 1]
            del options[i : i + 2]
            break
        if option.startswith("--log-format="):
            os.environ["CLEVERAGENTS_LOG_FORMAT"] = option.split("=", 1)[1]
            del options[i]
            break
    settings = Settings.from_env()  # a bad setting: one line and exit 2 here, not a failed start
    celery_settings(settings)  # and a URL no broker speaks
    if settings.signing is not None:
        check_signing(settings.signing)  # and so is a signing key that does not load
    if not any(o in ("-l", "--loglevel") or o.startswith("--loglevel=") for o in options):
        # Celery's default (WARNING) hides the one line per invocation (docs/operations.md).
        options = ["--loglevel", "INFO", *options]
    command = worker_command(*options)
    sys.stdout.flush()
    os.execv(command[0], command)
