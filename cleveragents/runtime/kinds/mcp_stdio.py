"""The stdio transport of the ``mcp`` kind: a server's output read under the output limit.

The SDK's ``stdio_client`` reads a server's stdout as text split into lines with
no bound (and joins a long line again for every chunk, so a 300 MB line keeps
the event loop busy long past any deadline). This transport reads bytes in
chunks, counts each on the session's ``Meter`` before keeping it, and hands
every line to the session as the SDK does (a ``SessionMessage``, or the error
that parsing it raised). When the meter trips, the server is stopped at once
(SIGTERM to its shepherd, which kills its whole tree) and its output ends for
the session.

Otherwise a server starts and stops as under the SDK's transport: in a session
of its own, with the SDK's default environment under the one given; stopped by
closing its stdin, then SIGTERM after 2 s, then SIGKILL, every wait bounded.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TextIO

import anyio
from anyio.abc import ByteReceiveStream, Process
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import types
from mcp.client.stdio import get_default_environment
from mcp.shared.message import SessionMessage

from cleveragents.runtime.kinds.mcp_bounds import Meter, OverLimit

__all__ = ["stdio_transport"]

#: Bytes read from a server's stdout at a time.
_CHUNK = 65_536
#: How long a server may take to exit once its stdin is closed, and once it is sent SIGTERM
#: (the SDK's own grace periods).
_EXIT_GRACE_S = 2.0
#: How long the messages already accepted may take to reach the server when the session ends.
_FLUSH_S = 0.5
_POLL_S = 0.01
_Received = SessionMessage | Exception
#: The (read, write) streams a ``ClientSession`` takes.
_Streams = tuple[MemoryObjectReceiveStream[_Received], MemoryObjectSendStream[SessionMessage]]


@asynccontextmanager
async def stdio_transport(
    argv: list[str], env: dict[str, str], errlog: TextIO, meter: Meter
) -> AsyncIterator[_Streams]:
    """Run ``argv`` and yield the session's (read, write) streams to it (see the module doc).

    Raises:
        OSError: the program cannot be started.
    """
    process = await anyio.open_process(
        argv, env=get_default_environment() | env, stderr=errlog, start_new_session=True
    )
    # No await before the task group is entered: a cancellation there would leak the process.
    read_send, read_stream = anyio.create_memory_object_stream[_Received](0)
    write_stream, write_receive = anyio.create_memory_object_stream[SessionMessage](0)
    written = anyio.Event()
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(_read, process, read_send, meter)
        tasks.start_soon(_write, process, write_receive, read_send, written)
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):  # the server is stopped, whoever cancels us
                read_stream.close()
                write_stream.close()
                if not meter.tripped:
                    with anyio.move_on_after(_FLUSH_S):
                        await written.wait()
                await _stop(process, graceful=not meter.tripped)
            tasks.cancel_scope.cancel()


def _parsed(line: bytes) -> _Received:
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:  # not JSON-RPC: the session sees the error, as from the SDK's
        return exc


async def _read(process: Process, send: MemoryObjectSendStream[_Received], meter: Meter) -> None:
    assert process.stdout is not None
    line = bytearray()
    async with send:
        try:
            while True:
                chunk = await process.stdout.receive(_CHUNK)
                start = 0
                while (end := chunk.find(b"\n", start)) >= 0:
                    meter.add(end + 1 - start, len(line) + end - start)
                    line += chunk[start:end]
                    start = end + 1
                    if line.strip():
                        await send.send(_parsed(bytes(line)))
                    line.clear()
                meter.add(len(chunk) - start, len(line) + len(chunk) - start)
                line += chunk[start:]
        except OverLimit:
            _signal(process, kill=False)  # the shepherd kills the server's whole tree
        except anyio.BrokenResourceError:  # the session has gone: a server blocked writing
            await _drain(process.stdout)  # must still see its stdin end, and exit
        except (anyio.EndOfStream, anyio.ClosedResourceError, OSError):
            pass  # the server's end, or our own stop closed the pipe


async def _drain(stdout: ByteReceiveStream) -> None:
    closed = (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError)
    with contextlib.suppress(*closed):
        while True:
            await stdout.receive(_CHUNK)


async def _write(
    process: Process,
    receive: MemoryObjectReceiveStream[SessionMessage],
    read_send: MemoryObjectSendStream[_Received],
    written: anyio.Event,
) -> None:
    assert process.stdin is not None
    try:
        async with receive:
            async for message in receive:
                data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                await process.stdin.send(data.encode() + b"\n")
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        read_send.close()  # the server stopped reading: the session sees its end
    finally:
        written.set()


def _signal(process: Process, *, kill: bool) -> None:
    with contextlib.suppress(ProcessLookupError):
        process.kill() if kill else process.terminate()


async def _exited(process: Process, timeout_s: float) -> bool:
    """Whether the process ended within ``timeout_s`` (polled: ``wait`` also waits for the
    pipes, which a process the server left behind may hold)."""
    with anyio.move_on_after(timeout_s):
        while process.returncode is None:
            await anyio.sleep(_POLL_S)
    return process.returncode is not None


async def _stop(process: Process, *, graceful: bool) -> None:
    """Close the server's stdin and give it time to exit (when ``graceful``), then SIGTERM,
    then SIGKILL; then close the pipes."""
    assert process.stdin is not None
    assert process.stdout is not None
    if graceful:
        with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            await process.stdin.aclose()
    if not graceful or not await _exited(process, _EXIT_GRACE_S):
        _signal(process, kill=False)
        if not await _exited(process, _EXIT_GRACE_S):
            _signal(process, kill=True)
            await _exited(process, _EXIT_GRACE_S)
    if process.returncode is not None:
        with anyio.move_on_after(_EXIT_GRACE_S):
            await process.aclose()  # closes the pipes, and the subprocess transport with them
        return
    for pipe in (process.stdin, process.stdout):  # a process that cannot die: leave it
        with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            await pipe.aclose()
