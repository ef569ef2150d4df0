"""Command tool: count lines and characters of a text; read-only."""

from __future__ import annotations

import json
import sys


def main() -> int:
    """Read ``{"text"}`` from stdin, print line and character counts."""
    args = json.load(sys.stdin)
    text = str(args["text"])
    json.dump({"lines": len(text.splitlines()), "chars": len(text)}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
