"""Output helpers for the CLI: JSON for machines, tables for people, one-line errors."""

from __future__ import annotations

import sys
from functools import cache
from typing import TYPE_CHECKING, Any

import click

from cleveragents.runtime.text import json_text

if TYPE_CHECKING:
    from rich.console import Console

    console: Console
    err_console: Console

__all__ = ["CliFailure", "console", "err_console", "print_json", "to_jsonable"]


@cache
def _consoles() -> tuple[Console, Console]:
    # rich is imported when a table is printed, not by every command that imports this
    from rich.console import Console

    return Console(highlight=False, soft_wrap=False), Console(stderr=True, highlight=False)


def __getattr__(name: str) -> Any:
    """``console`` (stdout) and ``err_console`` (stderr): rich consoles, made on first use."""
    if name == "console":
        return _consoles()[0]
    if name == "err_console":
        return _consoles()[1]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    pydantic = sys.modules.get("pydantic")  # not loaded: no value is a model
    if pydantic is not None and isinstance(value, pydantic.BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list):
        return [to_jsonable(v) for v in value]
    return value


def print_json(value: Any) -> None:
    """Print one JSON document on stdout."""
    sys.stdout.write(json_text(to_jsonable(value)) + "\n")
    sys.stdout.flush()
