"""Output helpers for the CLI: JSON for machines, tables for people, one-line errors."""

from __future__ import annotations

import sys
from typing import Any

import click
from pydantic import BaseModel
from rich.console import Console

from cleveragents.runtime.text import json_text

__all__ = ["CliFailure", "console", "err_console", "print_json", "to_jsonable"]

console = Console(highlight=False, soft_wrap=False)
err_console = Console(stderr=True, highlight=False)


class CliFailure(click.ClickException):
    """A failure the CLI reports on one line, with its own exit code."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code  # type: ignore[misc]  # click declares it on the class

    def show(self, file: Any = None) -> None:
        """Print ``error: message`` on stderr."""
        click.echo(f"error: {self.format_message()}", err=True)


def to_jsonable(value: Any) -> Any:
    """Pydantic models and lists of them as plain JSON data."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list):
        return [to_jsonable(v) for v in value]
    return value


def print_json(value: Any) -> None:
    """Print one JSON document on stdout."""
    sys.stdout.write(json_text(to_jsonable(value)) + "\n")
    sys.stdout.flush()
