"""The output limit of the invocation running in this context, for every tool kind to read.

``invoke`` sets it around the tool (its ``max_output_bytes``); a kind that reads
a tool's output from somewhere (a pipe, a file) stops reading there and raises
``ToolOutputTooLarge``, so nothing larger is ever held or stored. A context
variable: each thread and each nested invocation sees its own. Where ``invoke``
is given no limit, the process's default applies: 10 MB, or what a worker set at
start from ``CLEVERAGENTS_MAX_OUTPUT_BYTES`` (``set_default_output_limit``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

__all__ = [
    "MAX_OUTPUT_BYTES",
    "default_output_limit",
    "max_output_bytes",
    "output_limit",
    "set_default_output_limit",
]

#: Largest tool output kept, in bytes, unless configured (CLEVERAGENTS_MAX_OUTPUT_BYTES).
MAX_OUTPUT_BYTES = 10_000_000

_default = [MAX_OUTPUT_BYTES]
_limit: ContextVar[int | None] = ContextVar("cleveragents_max_output_bytes", default=None)


def set_default_output_limit(limit_bytes: int) -> None:
    """This process's output limit where none is given (a worker sets it once, at start)."""
    if limit_bytes <= 0:
        raise ValueError(f"the output limit must be positive, got {limit_bytes}")
    _default[0] = limit_bytes


def default_output_limit() -> int:
    """This process's output limit where none is given."""
    return _default[0]


def max_output_bytes() -> int:
    """The output limit of the invocation running in this context."""
    limit = _limit.get()
    return _default[0] if limit is None else limit


@contextlib.contextmanager
def output_limit(limit_bytes: int | None) -> Iterator[int]:
    """Make ``limit_bytes`` (None: the process default) the limit for the body of the ``with``."""
    limit = _default[0] if limit_bytes is None else limit_bytes
    token = _limit.set(limit)
    try:
        yield limit
    finally:
        _limit.reset(token)
