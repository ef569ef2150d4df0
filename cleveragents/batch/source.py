"""Read a JSONL file of requests as a stream, one ``BatchItem`` per non-blank line.

No line is held whole past ``MAX_LINE_CHARS``: a longer one is a bad line, read
past a megabyte at a time (a 200 MB line used to take the producer past 1 GB).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cleveragents.constants import MAX_REQUEST_BYTES
from cleveragents.errors import SchemaValidationError
from cleveragents.runtime.invoke import parse_request, read_json
from cleveragents.runtime.request import SkillInvocationRequest

__all__ = ["MAX_LINE_CHARS", "BatchItem", "derived_request_id", "read_jsonl"]

#: The longest line read as a request: four times what its arguments may take as compact
#: JSON (``MAX_REQUEST_BYTES``), room for any spacing and escapes.
MAX_LINE_CHARS = 4 * MAX_REQUEST_BYTES
#: A line too long is read past this many characters at a time.
_SKIP_CHARS = 1 << 20


@dataclass(frozen=True)
class BatchItem:
    """One line: its number, its request id, and the request or why it is not one."""

    line: int
    request_id: str
    request: SkillInvocationRequest | None
    problem: str | None = None
    skill: str = ""
    tool: str = ""


def derived_request_id(source: str, line: int, text: str) -> str:
    """A request id for a line without one: the same for the same file, line and content."""
    digest = hashlib.sha256(f"{source}\n{line}\n{text}".encode()).hexdigest()[:20]
    return f"line-{line}-{digest}"


def _named(data: Any, key: str) -> str:
    value = data.get(key) if isinstance(data, dict) else None
    return value if isinstance(value, str) else ""


def parse_line(source: str, line: int, text: str, *, allow_writes: bool) -> BatchItem:
    """Turn one line into a ``BatchItem``; ``allow_writes`` on the line counts only if allowed."""
    try:
        data = read_json(text)
    except json.JSONDecodeError as exc:
        return BatchItem(
            line, derived_request_id(source, line, text), None, f"line {line}: not JSON ({exc.msg})"
        )
    if not isinstance(data, dict):
        return BatchItem(
            line,
            derived_request_id(source, line, text),
            None,
            f"line {line}: a request is a JSON object",
        )
    if "request_id" not in data:
        data["request_id"] = derived_request_id(source, line, text)
    if not allow_writes:
        data["allow_writes"] = False
    try:
        request = parse_request(data)
    except SchemaValidationError as exc:
        rid = data["request_id"] if isinstance(data.get("request_id"), str) else ""
        return BatchItem(
            line,
            rid or derived_request_id(source, line, text),
            None,
            f"line {line}: {exc}",
            _named(data, "skill"),
            _named(data, "tool"),
        )
    return BatchItem(line, request.request_id, request, None, request.skill, request.tool)


def _too_long(source: str, line: int, head: str) -> BatchItem:
    return BatchItem(
        line,
        derived_request_id(source, line, head),
        None,
        f"line {line}: longer than {MAX_LINE_CHARS:,} characters (a request's arguments may "
        f"take {MAX_REQUEST_BYTES:,} bytes of JSON)",
    )


def read_jsonl(path: Path, *, allow_writes: bool) -> Iterator[BatchItem]:
    """Stream the file's requests; blank lines are skipped, bad ones become items with a problem."""
    source = str(path.resolve())
    limit = MAX_LINE_CHARS
    with path.open(encoding="utf-8-sig", errors="replace") as handle:  # a BOM is not text
        number = 0
        while raw := handle.readline(limit + 1):
            number += 1
            if len(raw) > limit and not raw.endswith("\n"):
                while (rest := handle.readline(_SKIP_CHARS)) and not rest.endswith("\n"):
                    pass
                yield _too_long(source, number, raw)
                continue
            text = raw.strip()
            if text:
                yield parse_line(source, number, text, allow_writes=allow_writes)
