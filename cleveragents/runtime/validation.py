"""JSON Schema validation with validators compiled once per schema and reused.

jsonschema-rs compiles a schema into a Rust validator; validating a small
object costs about a microsecond. See docs/runtime.md for why it was chosen.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

import jsonschema_rs

from cleveragents.errors import SchemaValidationError, ToolActivationError

__all__ = ["compiled", "schema_problem", "validate"]

_cache: dict[int, tuple[dict[str, Any], Any]] = {}
_lock = threading.Lock()
_QUOTED_TYPE = re.compile(r'is not of type "([^"]+)"')
_LEADING_STRING = re.compile(r'^"(?:[^"\\]|\\.)*"')
#: How many errors one message lists before it says "and N more".
_MAX_LISTED = 5


def compiled(schema: dict[str, Any]) -> Any:
    """The compiled validator of ``schema``, built the first time it is asked for.

    Schemas are catalogue objects that live as long as the process, so they are
    keyed by identity (and kept alive by the cache, so an id is never reused).
    """
    hit = _cache.get(id(schema))
    if hit is not None and hit[0] is schema:
        return hit[1]
    try:
        validator = jsonschema_rs.validator_for(schema)
    except (jsonschema_rs.ValidationError, ValueError) as exc:
        # A catalogue bug, not the caller's: the tool cannot be made ready to run.
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ToolActivationError(
            f"tool activation failed: its schema is not a valid JSON Schema: {first}",
            details={"schema_problem": first},
        ) from None
    with _lock:
        _cache[id(schema)] = (schema, validator)
    return validator


def schema_problem(schema: dict[str, Any]) -> str | None:
    """Why ``schema`` is not a valid JSON Schema, or None when it is."""
    try:
        jsonschema_rs.validator_for(schema)
    except (jsonschema_rs.ValidationError, ValueError) as exc:
        return str(exc).splitlines()[0]
    return None


def _shown_value(instance: Any) -> str:
    if isinstance(instance, str):
        return "a string"
    if isinstance(instance, dict):
        return "an object"
    return "an array"


def _readable(error: Any) -> str:
    """The error's message without the offending value when that value is text.

    Arguments can hold secrets, and messages end up in stored results, Flower and
    logs: a string, object or array is named by its kind, never quoted. Numbers,
    booleans and null are shown as they are (``3 is not of type 'string'``).
    """
    message: str = error.message
    instance = error.instance
    openings: dict[type, str] = {str: '"', dict: "{", list: "["}
    opening = openings.get(type(instance))
    if opening is not None and message.startswith(opening):
        rest = None
        if isinstance(instance, str):
            quoted = _LEADING_STRING.match(message)
            rest = message[quoted.end() :] if quoted else None
        else:
            for text in (json.dumps(instance, separators=(",", ":")), json.dumps(instance)):
                if message.startswith(text):
                    rest = message[len(text) :]
        if rest is None:
            kind = type(getattr(error, "kind", None)).__name__
            message = f"{_shown_value(instance)} does not satisfy {kind!r}"
        else:
            message = _shown_value(instance) + rest
    # jsonschema-rs quotes type names with double quotes; the docs and users expect 'string'.
    return _QUOTED_TYPE.sub(r"is not of type '\1'", message)


def _where(root: str, path: Any) -> str:
    return ".".join([root, *(str(p) for p in path)])


def validate(schema: dict[str, Any] | None, instance: Any, *, root: str, source: str) -> None:
    """Validate ``instance`` against ``schema``; a failure names the path in the data.

    Raises:
        SchemaValidationError: e.g. ``arguments.text: 3 is not of type 'string'``.
    """
    if schema is None:
        return
    validator = compiled(schema)
    if validator.is_valid(instance):
        return
    errors = list(validator.iter_errors(instance))
    readable = [(_where(root, e.instance_path), _readable(e)) for e in errors[:_MAX_LISTED]]
    lines = [f"{where}: {message}" for where, message in readable]
    if len(errors) > _MAX_LISTED:
        lines.append(f"and {len(errors) - _MAX_LISTED} more")
    raise SchemaValidationError(
        "; ".join(lines),
        details={
            "schema": source,
            "errors": [{"path": where, "message": message} for where, message in readable],
        },
    )
