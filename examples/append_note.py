"""Command tool: append a line to a note; arguments on stdin, one JSON value on stdout."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main() -> int:
    """Read ``{"name", "line"}`` from stdin, append the line, report the change."""
    args = json.load(sys.stdin)
    folder = Path(os.environ.get("CLEVERAGENTS_NOTES_DIR", ".cleveragents/notes"))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{Path(str(args['name'])).name}.txt"
    action = "changed" if path.exists() else "created"
    with path.open("a", encoding="utf-8") as handle:
        handle.write(str(args["line"]) + "\n")
    changes = os.environ.get("CLEVERAGENTS_RESOURCE_CHANGES")
    if changes:
        with open(changes, "a", encoding="utf-8") as log:
            log.write(json.dumps({"action": action, "resource": str(path)}) + "\n")
    print(f"appended to {path}", file=sys.stderr)
    json.dump(
        {"path": str(path), "lines": len(path.read_text(encoding="utf-8").splitlines())}, sys.stdout
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
