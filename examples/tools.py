"""Python tools of the example catalogue."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from cleveragents.runtime.output import ToolOutput


def notes_dir() -> Path:
    """Where the example note tools write (``CLEVERAGENTS_NOTES_DIR``)."""
    return Path(os.environ.get("CLEVERAGENTS_NOTES_DIR", ".cleveragents/notes"))


def echo(text: str) -> dict[str, str]:
    """Return the text unchanged."""
    return {"text": text}


def word_count(text: str) -> dict[str, int]:
    """Count the words in a text."""
    return {"words": len(text.split())}


def shout(text: str) -> dict[str, str]:
    """Upper-case a text."""
    return {"text": text.upper()}


def noop() -> dict[str, bool]:
    """Do nothing, quickly: the trivial tool of the benchmarks."""
    return {"ok": True}


def sleep(seconds: float) -> dict[str, float]:
    """Sleep, to show time-outs."""
    time.sleep(seconds)
    return {"slept": seconds}


def write_note(name: str, text: str) -> ToolOutput:
    """Write a note file and report it as a resource change."""
    folder = notes_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{Path(name).name}.txt"
    action = "changed" if path.exists() else "created"
    path.write_text(text, encoding="utf-8")
    return ToolOutput(
        {"path": str(path), "bytes": len(text.encode())},
        resource_changes=[{"action": action, "resource": str(path)}],
    )


def delete_note(name: str) -> Any:
    """Delete a note file if it exists."""
    path = notes_dir() / f"{Path(name).name}.txt"
    if not path.exists():
        return {"deleted": False}
    path.unlink()
    return ToolOutput(
        {"deleted": True}, resource_changes=[{"action": "deleted", "resource": str(path)}]
    )
