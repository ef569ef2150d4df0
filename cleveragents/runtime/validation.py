"""JSON Schema validation with validators compiled once per schema and reused.

jsonschema-rs compiles a schema into a Rust validator; validating a small
object costs about a microsecond. See docs/runtime.md for why it was chosen.
"""

from __future__ import annotations

import difflib
import json
import re
import threading
from typing import Any

import jsonschema_rs

from cleveragents.errors import SchemaValidationError, ToolActivationError
from cleveragents.skills.json_schemas import schema_problem, validator_for

__all__ = ["compiled", "schema_problem", "validate"]

_cache: dict[int, tuple[dict[str, Any], Any]] = {}
_lock = threading.Lock()
#: How many errors one message lists before it says "and N more".
_MAX_LISTED = 5
#: Longest schema value (an enum, a pattern, a bound) quoted in a message.
_MAX_SHOWN = 80
_named_cache: dict[int, tuple[dict[str, Any], set[str]]] = {}


def compiled(schema: dict[str, Any]) -> Any:
    """The compiled validator of ``schema``, built the first time it is asked for.

    Schemas are catalogue objects that live as long as the process, so they are
    keyed by identity (and kept alive by the cache, so an id is never reused).
    """
    hit = _cache.get(id(schema))
    if hit is not None and hit[0] is schema:
        return hit[1]
    try:
        validator = _validator(schema)
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


def _validator(schema: dict[str, Any]) -> Any:
    return validator_for(schema)  # never fetches (skills/json_schemas.py)


def _json_kind(instance: Any) -> str:
    """The JSON type of a value, with its article: what a message may say of the value."""
    if isinstance(instance, bool):
        return "a boolean"
    if isinstance(instance, int):
        return "an integer"
    if isinstance(instance, float):
        return "a number"
    if isinstance(instance, str):
        return "a string"
    if isinstance(instance, dict):
        return "an object"
    if isinstance(instance, list):
        return "an array"
    return "null"


def _shown(value: Any) -> str:
    """A value from the schema (never from the instance), short and on one line."""
    text = json.dumps(value, separators=(",", ":"), default=str)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."


def _keyword(error: Any) -> str:
    """The schema keyword that failed: the last keyword of the error's schema path."""
    words = [p for p in error.schema_path if isinstance(p, str)]
    return words[-1] if words else "schema"


def _types(kind: Any) -> str:
    types = [str(t).split(".")[-1].lower() for t in getattr(kind, "types", [])]
    return " or ".join(f"'{t}'" for t in types) or "the expected type"


def _limit(kind: Any) -> Any:
    return getattr(kind, "limit", None)


#: What each failing keyword says, from the schema alone: (kind name) -> text builder.
_MESSAGES: dict[str, Any] = {
    "Type": lambda e, k: f"{_json_kind(e.instance)} is not of type {_types(k)}",
    "Enum": lambda e, k: f"must be one of {_shown(getattr(k, 'options', []))}",
    "Constant": lambda e, k: f"must equal {_shown(getattr(k, 'expected_value', None))}",
    "Not": lambda e, k: "must not be valid under the schema in 'not'",
    "FalseSchema": lambda e, k: "is not allowed here (the schema is false)",
    "Contains": lambda e, k: "has no item valid under 'contains'",
    "PropertyNames": lambda e, k: "has a property name that is not valid under 'propertyNames'",
    "Pattern": lambda e, k: f"does not match the pattern {_shown(getattr(k, 'pattern', ''))}",
    "Format": lambda e, k: f"is not a valid {_shown(getattr(k, 'format', ''))}",
    "MinLength": lambda e, k: f"is shorter than {_limit(k)} characters",
    "MaxLength": lambda e, k: f"is longer than {_limit(k)} characters",
    "MinItems": lambda e, k: f"has fewer than {_limit(k)} items",
    "MaxItems": lambda e, k: f"has more than {_limit(k)} items",
    "MinProperties": lambda e, k: f"has fewer than {_limit(k)} properties",
    "MaxProperties": lambda e, k: f"has more than {_limit(k)} properties",
    "UniqueItems": lambda e, k: "has duplicate items",
    "Minimum": lambda e, k: f"is less than the minimum of {_shown(_limit(k))}",
    "Maximum": lambda e, k: f"is greater than the maximum of {_shown(_limit(k))}",
    "ExclusiveMinimum": lambda e, k: f"must be greater than {_shown(_limit(k))}",
    "ExclusiveMaximum": lambda e, k: f"must be less than {_shown(_limit(k))}",
    "MultipleOf": lambda e, k: f"is not a multiple of {_shown(getattr(k, 'multiple_of', ''))}",
    "OneOfNotValid": lambda e, k: "is valid under none of the schemas in 'oneOf'",
    "OneOfMultipleValid": lambda e, k: "is valid under more than one of the schemas in 'oneOf'",
    "AnyOf": lambda e, k: "is valid under none of the schemas in 'anyOf'",
    "Required": lambda e, k: f"{_shown(getattr(k, 'property', ''))} is a required property",
    "AdditionalProperties": lambda e, k: "has properties that 'additionalProperties' forbids",
    "UnevaluatedProperties": lambda e, k: "has properties that 'unevaluatedProperties' forbids",
    "AdditionalItems": lambda e, k: "has items that 'additionalItems' forbids",
    "UnevaluatedItems": lambda e, k: "has items that 'unevaluatedItems' forbids",
}


#: An unexpected key shown by name: a short word (letters, '_' and '-'), or a near miss
#: of a property the schema names. Any other key (digits, length: a token, an id) may
#: be a value an agent put in the wrong place, a secret even: it stays unnamed.
_SHOWN_KEY = re.compile(r"[A-Za-z_][A-Za-z_-]{0,23}")
#: Unexpected keys named in one message.
_KEYS_SHOWN = 5


def _at(schema: Any, path: Any) -> Any:
    """The part of ``schema`` at ``path`` (keys and indexes), or None."""
    node = schema
    for step in path:
        try:
            node = node[step]
        except (KeyError, IndexError, TypeError):
            return None
    return node


def _unexpected(error: Any, schema: dict[str, Any]) -> str:
    """The properties 'additionalProperties' forbids, by name where a name is safe to
    show, with the schema's closest property for a misspelt one."""
    keys = [str(k) for k in getattr(error.kind, "unexpected", [])]
    owner = _at(schema, list(error.schema_path)[:-1])
    properties = owner.get("properties") if isinstance(owner, dict) else None
    known = [k for k in properties if isinstance(k, str)] if isinstance(properties, dict) else []
    named = []
    for key in keys:
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
        if close:
            named.append(f"{key!r} (did you mean {close[0]!r}?)")
        elif _SHOWN_KEY.fullmatch(key):
            named.append(repr(key))
    named = named[:_KEYS_SHOWN]
    if not named:
        return "has properties that 'additionalProperties' forbids"
    more = len(keys) - len(named)
    tail = f" and {more} more" if more else ""
    plural = "properties" if len(named) > 1 else "property"
    allowed = f"; allowed: {', '.join(known)}" if known and len(known) <= 10 else ""
    return f"has the {plural} {', '.join(named)}{tail}, which it does not allow{allowed}"


def _readable(error: Any, schema: dict[str, Any]) -> str:
    """What failed, built from the schema and the failing keyword, never from the value.

    Arguments can hold secrets, and messages end up in stored results, Flower and
    logs: a message names the keyword and what the schema expects (a type, a bound,
    a pattern), and of the value at most its JSON type (``an integer is not of type
    'string'``).
    """
    kind = error.kind
    if type(kind).__name__ == "AdditionalProperties":
        try:
            return _unexpected(error, schema)
        except Exception:  # an attribute missing in another jsonschema-rs version
            return "has properties that 'additionalProperties' forbids"
    build = _MESSAGES.get(type(kind).__name__)
    if build is None:
        return f"is not valid under {_keyword(error)!r}"
    try:
        return str(build(error, kind))
    except Exception:  # an attribute missing in another jsonschema-rs version
        return f"is not valid under {_keyword(error)!r}"


def _named_properties(schema: Any, into: set[str]) -> set[str]:
    """Every property name the schema itself names (so a path through it may be shown)."""
    if isinstance(schema, dict):
        for key in ("properties", "dependentSchemas", "dependentRequired", "patternProperties"):
            named = schema.get(key)
            if isinstance(named, dict) and key != "patternProperties":
                into.update(k for k in named if isinstance(k, str))
        required = schema.get("required")
        if isinstance(required, list):
            into.update(r for r in required if isinstance(r, str))
        for value in schema.values():
            _named_properties(value, into)
    elif isinstance(schema, list):
        for value in schema:
            _named_properties(value, into)
    return into


def _where(root: str, path: Any, named: set[str]) -> str:
    # A key the schema does not name came from the instance (it may be a secret): "*".
    parts = [str(p) if isinstance(p, int) or p in named else "*" for p in path]
    return ".".join([root, *parts])


def _names(schema: dict[str, Any]) -> set[str]:
    hit = _named_cache.get(id(schema))
    if hit is not None and hit[0] is schema:
        return hit[1]
    named = _named_properties(schema, set())
    with _lock:
        _named_cache[id(schema)] = (schema, named)
    return named


def validate(schema: dict[str, Any] | None, instance: Any, *, root: str, source: str) -> None:
    """Validate ``instance`` against ``schema``; a failure names the path in the data.

    Raises:
        SchemaValidationError: e.g. ``arguments.text: an integer is not of type 'string'``.
    """
    if schema is None:
        return
    validator = compiled(schema)
    if validator.is_valid(instance):
        return
    errors = list(validator.iter_errors(instance))
    named = _names(schema)
    readable = [
        (_where(root, e.instance_path, named), _readable(e, schema))
        for e in errors[:_MAX_LISTED]
    ]
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
