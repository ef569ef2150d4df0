"""Read a JSONL file of requests as a stream, one ``BatchItem`` per non-blank line."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cleveragents.errors import SchemaValidationError
from cleveragents.runtime.invoke import parse_request, read_json
from cleveragents.runtime.request import SkillInvocationRequest

__all__ = ["BatchItem", "derived_request_id", "read_jsonl"]


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


def read_jsonl(path: Path, *, allow_writes: bool) -> Iterator[BatchItem]:
    """Stream the file's requests; blank lines are skipped, bad ones become items with a problem."""
    source = str(path.resolve())
    with path.open(encoding="utf-8", errors="replace") as handle:
        for number, raw in enumerate(handle, 1):
            text = raw.strip()
            if text:
                yield parse_line(source, number, text, allow_writes=allow_writes)
