"""A skill's JSON Schemas: compiled without ever fetching, and checked in plain words.

A schema is checked as its skill file loads (``skills/model.py``), with every other
problem of the file and at the schema's own line: a mistyped type is said as one
(``type 'strin' is not a JSON Schema type; did you mean 'string'?``), not as the
meta-schema's ``"strin" is not valid under any of the schemas listed in the 'anyOf'
keyword``, and the skill does not load, instead of failing when its tool first runs.
"""

from __future__ import annotations

import difflib
from typing import Any

import jsonschema_rs

__all__ = ["JSON_TYPES", "RetrievalRefused", "schema_problem", "validator_for"]

#: The types JSON Schema knows.
JSON_TYPES = ("string", "number", "integer", "boolean", "object", "array", "null")


class RetrievalRefused(ValueError):
    """Raised when a schema refers to a document outside itself: nothing is fetched."""


def _refuse_retrieval(uri: str) -> Any:
    shown = uri if len(uri) <= 60 else uri[:57] + "..."
    raise RetrievalRefused(f"it refers to {shown!r}, outside itself: nothing is fetched")


def validator_for(schema: dict[str, Any]) -> Any:
    """``schema`` compiled. Never fetches: a reference outside the schema (a file, a URL,
    a remote meta-schema) is refused before anything is read; the standard drafts are
    built in.

    Raises:
        jsonschema_rs.ValidationError, ValueError: it is not a valid JSON Schema.
    """
    return jsonschema_rs.validator_for(schema, retriever=_refuse_retrieval)


def schema_problem(schema: dict[str, Any]) -> str | None:
    """Why ``schema`` is not a valid JSON Schema, in plain words, or None when it is."""
    said = _type_problem(schema)
    if said is not None:
        return said
    try:
        validator_for(schema)
    except (jsonschema_rs.ValidationError, ValueError) as exc:
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return None


#: Keywords whose value maps names to subschemas, holds a list of them, or is one.
_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_ONE = (
    "items",
    "not",
    "if",
    "then",
    "else",
    "additionalProperties",
    "contains",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
    "additionalItems",
)


def _type_problem(schema: Any) -> str | None:
    """The first ``type`` of ``schema`` or a subschema that names no JSON type."""
    stack: list[Any] = [schema]
    while stack:
        value = stack.pop()
        if not isinstance(value, dict):
            continue
        given = value.get("type", JSON_TYPES[0])
        for name in given if isinstance(given, list) else [given]:
            if not isinstance(name, str):
                return (
                    f"type {name!r} is not a JSON Schema type (the types: {', '.join(JSON_TYPES)})"
                )
            if name not in JSON_TYPES:
                close = difflib.get_close_matches(name, JSON_TYPES, n=1, cutoff=0.6)
                guess = f"; did you mean {close[0]!r}?" if close else ""
                return (
                    f"type {name!r} is not a JSON Schema type{guess} (the types: "
                    f"{', '.join(JSON_TYPES)})"
                )
        for key in _MAPS:
            if isinstance(value.get(key), dict):
                stack.extend(value[key].values())
        for key in _LISTS:
            if isinstance(value.get(key), list):
                stack.extend(value[key])
        for key in _ONE:
            if isinstance(value.get(key), dict):
                stack.append(value[key])
    return None
