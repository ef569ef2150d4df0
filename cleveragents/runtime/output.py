"""What a python tool may return besides plain JSON data."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["ToolOutput"]


@dataclass(frozen=True)
class ToolOutput:
    """A tool's output with the resources it created, changed or deleted.

    Each resource change is a dict with at least ``action`` (``created``,
    ``changed`` or ``deleted``) and ``resource``.
    """

    data: Any
    resource_changes: list[dict[str, Any]] = field(default_factory=list)
