"""``python -m cleveragents``: the CLI."""

from cleveragents.cli import main

main()
