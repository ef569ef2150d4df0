"""The ``cleveragents`` command line."""

from __future__ import annotations

import sys

from cleveragents.cli.app import cli
from cleveragents.cli.app import main as _main

__all__ = ["cli", "main"]


def main() -> None:
    """Console-script entry point."""
    sys.exit(_main())
