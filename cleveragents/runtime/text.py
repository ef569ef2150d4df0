"""Text of untrusted values: the strings a JSON value holds, and text that UTF-8 can hold.

``strings_in`` walks a JSON value's strings (what redaction blanks out of text
shown to people). The rest finds, replaces or escapes lone surrogates:

JSON may escape half of a surrogate pair (``"\\ud800"``); Python decodes it to a
string that no UTF-8 file, log, Redis key, pydantic JSON or terminal can hold:
writing it raises ``UnicodeEncodeError``. So requests and tool output holding
one are refused (``runtime/invoke.py``), text a failure echoes is made writable
(``runtime/outcomes.py``), and what the CLI writes falls back to JSON's ASCII escapes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

__all__ = [
    "blank_arguments",
    "holds_lone_surrogate",
    "json_text",
    "lone_surrogate",
    "strings_in",
    "writable",
    "writable_value",
]

_REPLACEMENT = "\ufffd"


def lone_surrogate(text: str) -> bool:
    """Whether ``text`` holds a lone surrogate (ASCII text costs one check)."""
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def holds_lone_surrogate(value: Any) -> bool:
    """Whether a string or a mapping key anywhere in ``value`` holds a lone surrogate.

    Walked without recursion (any depth); dicts, lists and tuples are looked into.
    """
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if lone_surrogate(item):
                return True
        elif isinstance(item, dict):
            for key, child in item.items():
                if isinstance(key, str) and lone_surrogate(key):
                    return True
                if isinstance(child, str | dict | list | tuple):
                    stack.append(child)
        elif isinstance(item, list | tuple):
            stack.extend(c for c in item if isinstance(c, str | dict | list | tuple))
    return False


def writable(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD (as it is when it has none)."""
    if not lone_surrogate(text):
        return text
    return "".join(_REPLACEMENT if "\ud800" <= c <= "\udfff" else c for c in text)


def writable_value(value: Any) -> Any:
    """``value`` with ``writable`` strings and keys throughout (small values: details)."""
    if isinstance(value, str):
        return writable(value)
    if isinstance(value, dict):
        return {
            writable(k) if isinstance(k, str) else k: writable_value(v) for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [writable_value(v) for v in value]
    return value


def json_text(value: Any, **options: Any) -> str:
    """``json.dumps(value, ensure_ascii=False)``, or JSON's ASCII escapes where UTF-8 cannot
    hold the text: the same JSON value either way."""
    text = json.dumps(value, ensure_ascii=False, **options)
    return json.dumps(value, **options) if lone_surrogate(text) else text


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


#: Argument strings shorter than this are not blanked out of excerpts (they are words).
SHORTEST_BLANKED = 4


def blank_arguments(text: str, arguments: Any, blank: str) -> str:
    """``text`` with every argument string in it (and its JSON spelling) replaced by ``blank``.

    What a tool or a server says on failure (its stderr, an error text) is shown to
    people and stored: it must not repeat the arguments, which can hold secrets.
    """
    secrets = {s for s in strings_in(arguments) if len(s) >= SHORTEST_BLANKED}
    secrets |= {json.dumps(s)[1:-1] for s in secrets}  # as a tool echoing its JSON input shows it
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, blank)
    return text
