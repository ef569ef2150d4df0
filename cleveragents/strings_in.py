"""Every string inside a JSON value: what redaction blanks out of text shown to people."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["strings_in"]


def strings_in(value: Any) -> Iterator[str]:
    """The strings of ``value``, depth first: itself, or those of its values and items."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings_in(item)
