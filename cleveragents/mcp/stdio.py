"""Read MCP messages from a stdin pipe without a blocking thread.

The SDK's ``stdio_server`` reads stdin with ``readline`` in a worker thread,
which no cancellation can interrupt: a server told to stop (SIGTERM from its
host) while the host keeps stdin open would wait for a line that never comes,
and its local worker would outlive it. Lines read here wait on the event loop
instead (``anyio.wait_readable``), so a cancelled server stops at once.
"""

from __future__ import annotations

import os
import stat
from typing import Any, cast

import anyio

__all__ = ["PipeLines", "pipe_lines"]

_CHUNK = 1 << 16


class PipeLines:
    """The lines of a pipe, as an async iterator the SDK's ``stdio_server`` consumes."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buffer = b""
        self._eof = False
        os.set_blocking(fd, False)

    def __aiter__(self) -> PipeLines:
        return self

    async def __anext__(self) -> str:
        while b"\n" not in self._buffer and not self._eof:
            await anyio.wait_readable(self.fd)
            try:
                chunk = os.read(self.fd, _CHUNK)
            except BlockingIOError:
                continue
            self._eof = not chunk
            self._buffer += chunk
        if not self._buffer:
            raise StopAsyncIteration
        line, newline, self._buffer = self._buffer.partition(b"\n")
        return (line + newline).decode("utf-8", errors="replace")


def pipe_lines(fd: int) -> Any:
    """``PipeLines`` over ``fd`` when it is a pipe or socket, else None (the SDK's own reader).

    Typed ``Any``: ``stdio_server`` declares ``anyio.AsyncFile[str]`` but only iterates it.
    """
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return None
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        return None
    return cast(Any, PipeLines(fd))
