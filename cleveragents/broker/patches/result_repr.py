"""The text of a task's return value, made without Celery's slow path when it is small.

After a task succeeds, Celery's tracer turns its return value into text with
``celery.utils.saferepr.saferepr`` (``celery.app.trace`` reads the name from its
module globals), and the worker sends that text in its ``task-succeeded`` event,
which Flower shows. ``saferepr`` is pure Python: 90 us for a ``SkillResult``
payload of a trivial tool against 2.6 us for ``repr`` (``/tmp`` timeit), every
successful invocation, in the pool process. Where the value is small and made only
of dicts, lists, plain strings, numbers, booleans and None, ``repr`` gives the very
same text, and is used; anything else goes to ``saferepr`` as before.
"""

from __future__ import annotations

from typing import Any

from celery.app import trace
from celery.utils.saferepr import saferepr

from cleveragents.broker.patches.patch import Patch

__all__ = ["PATCH", "install", "installed", "quick_saferepr"]

#: A container this deep (the value itself at 0) goes to saferepr, which writes it as
#: ``{...}`` or ``[...]`` (its ``maxlevels``, 3 by default, as the tracer calls it).
_MAX_DEPTH = 3
#: Characters a string may hold for repr to write it as saferepr does: printable
#: ASCII without quotes or backslashes (saferepr writes escapes and quotes its own way).
_PLAIN = frozenset(chr(c) for c in range(32, 127)) - {"'", '"', "\\"}


def _fits(value: Any, budget: int, depth: int = 0) -> int:
    """What is left of ``budget`` characters after ``value``'s repr; -1 where it does not
    fit, or where repr would not write it as saferepr does."""
    kind = type(value)
    if kind is str:
        budget -= len(value) + 2
        return budget if budget >= 0 and _PLAIN.issuperset(value) else -1
    if value is None or kind is bool:
        return budget - 5
    if kind is int:
        return budget - len(str(value)) if value.bit_length() < 64 else -1
    if kind is float:
        return budget - 24
    if depth >= _MAX_DEPTH:
        return -1
    if kind is dict:
        budget -= 2
        for key, item in value.items():
            if type(key) is not str:
                return -1
            budget = _fits(key, budget - 4, depth + 1)
            if budget < 0:
                return -1
            budget = _fits(item, budget, depth + 1)
            if budget < 0:
                return -1
        return budget
    if kind is list:
        budget -= 2
        for item in value:
            budget = _fits(item, budget - 2, depth + 1)
            if budget < 0:
                return -1
        return budget
    return -1


def quick_saferepr(value: Any, maxlen: int | None = None, *args: Any, **kwargs: Any) -> str:
    """``saferepr``'s text of ``value``, by ``repr`` where that gives the same text."""
    # saferepr shortens a text of maxlen characters or more: repr only below that
    if maxlen is not None and not args and not kwargs and _fits(value, maxlen - 1) >= 0:
        return repr(value)
    return saferepr(value, maxlen, *args, **kwargs)


def install() -> None:
    """Make Celery's tracer use ``quick_saferepr`` (idempotent)."""
    setattr(trace, "saferepr", quick_saferepr)  # noqa: B010 (absent from Celery's stubs)


def installed() -> bool:
    """True once ``install`` has run in this process."""
    return getattr(trace, "saferepr", None) is quick_saferepr


PATCH = Patch.for_part(__name__, "result-repr-patch", install)
