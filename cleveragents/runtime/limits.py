"""The output limit of the invocation running in this context, for every tool kind to read.

``invoke`` sets it around the tool (its ``max_output_bytes``); a kind that reads
a tool's output from somewhere (a pipe, a file) stops reading there and raises
``ToolOutputTooLarge``, so nothing larger is ever held or stored. A kind run
outside ``invoke`` sees the default. A context variable, not a setting: each
thread and each nested invocation sees its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

__all__ = ["MAX_OUTPUT_BYTES", "max_output_bytes", "output_limit"]

#: Largest tool output kept, in bytes (CLEVERAGENTS_MAX_OUTPUT_BYTES).
MAX_OUTPUT_BYTES = 10_000_000

_limit: ContextVar[int] = ContextVar("cleveragents_max_output_bytes", default=MAX_OUTPUT_BYTES)


def max_output_bytes() -> int:
    """The output limit of the invocation running in this context."""
    return _limit.get()


@contextlib.contextmanager
def output_limit(limit_bytes: int) -> Iterator[None]:
    """Make ``limit_bytes`` the output limit for the body of the ``with``."""
    token = _limit.set(limit_bytes)
    try:
        yield
    finally:
        _limit.reset(token)
