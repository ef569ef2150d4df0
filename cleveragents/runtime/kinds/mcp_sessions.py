"""MCP client sessions of the ``mcp`` tool kind: one per server, per process, kept open.

A daemon thread runs an asyncio event loop that owns every session of this
process. A tool call is a coroutine submitted to that loop (``SessionPool.call``)
and bounded by the call's deadline. Each session is held open by one task on the
loop (the SDK's transports must be entered and left in the same task) and is
shared by every call to the same server. A stdio server that exits ends its
session; the next call starts the server again. A forked child never uses its
parent's sessions (the pool is checked against ``os.getpid()``), and a process
closes its sessions when it exits (``close_sessions``).

Every session has a ``Meter`` (``mcp_bounds``) on its transport: a call that is
sent more than its output limit ends at once, and the session is closed (a stdio
server is stopped; ``mcp_stdio`` is the stdio transport that reads under it).

This module raises its own small errors (``ServerUnavailable``, ``ConnectionLost``,
``CallTimedOut``, ``AnswerTooLarge``) and lets the SDK's ``MCPError`` through; the
kind (``mcp_tool``) turns them into the library's.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import fcntl
import os
import sys
import tempfile
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TextIO, cast

import anyio
from anyio.abc import ObjectSendStream
from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

from cleveragents.constants import STDERR_TAIL_CHARS
from cleveragents.runtime.confined import SHEPHERD, ToolUser
from cleveragents.runtime.kinds.command import BASE_ENV, forwarder_python, scratch_folder
from cleveragents.runtime.kinds.command import KIND as COMMAND_KIND
from cleveragents.runtime.kinds.mcp_bounds import IDENTITY, Meter, bound_http
from cleveragents.runtime.kinds.mcp_stdio import stdio_transport
from cleveragents.runtime.output_limit import default_output_limit
from cleveragents.runtime.sandbox import sandboxed_environment
from cleveragents.skills.policies import Sandbox

__all__ = [
    "CLOSE_TIMEOUT_S",
    "SERVER_LIFETIME_S",
    "START_TIMEOUT_S",
    "AnswerTooLarge",
    "CallTimedOut",
    "ConnectionLost",
    "ServerSpec",
    "ServerUnavailable",
    "SessionPool",
    "close_sessions",
    "sessions",
    "shepherded",
]

#: Longest a server may take to start and answer ``initialize``, whatever the calls wait.
START_TIMEOUT_S = 60.0
#: Longest ``close_sessions`` waits for the servers to stop (the SDK's own grace is 2 + 2 s).
CLOSE_TIMEOUT_S = 6.0
#: How long after a call's deadline the caller stops waiting for the loop itself.
_BACKSTOP_S = 5.0
#: A stdio server's stderr file is cut back to its tail past this many bytes.
_STDERR_KEEP = 1_000_000
#: A stdio server's shepherd's own deadline: none that matters (a session lives as long as
#: its process; the shepherd stops the server when told to, or when this process dies).
SERVER_LIFETIME_S = 10 * 365 * 86400.0
#: HTTP timeouts of a streamable-HTTP session (the SDK's defaults: a response may stream).
_HTTP_TIMEOUT_S, _HTTP_READ_TIMEOUT_S = 30.0, 300.0

#: A transport's (read, write) stream pair, as the SDK's ClientSession takes it.
_Streams = tuple[Any, Any]


class ServerUnavailable(Exception):
    """Raised when a server cannot be started or reached, or did not answer ``initialize``."""

    def __init__(self, reason: str, stderr_tail: str = "") -> None:
        super().__init__(reason)
        self.stderr_tail = stderr_tail


class ConnectionLost(Exception):
    """Raised when a server's connection ended during a call (a stdio server that exited)."""

    def __init__(self, stderr_tail: str = "") -> None:
        super().__init__("the server closed the connection during the call")
        self.stderr_tail = stderr_tail


class CallTimedOut(Exception):
    """Raised when a call outlived its deadline (the request was cancelled on the server)."""


class AnswerTooLarge(Exception):
    """Raised when a server sent a call more than its output limit (the session was closed)."""

    def __init__(self, limit_bytes: int) -> None:
        super().__init__(f"the server sent more than the output limit of {limit_bytes} bytes")
        self.limit_bytes = limit_bytes


class _SessionExpired(Exception):
    """Raised when an HTTP server refused a request of a session it does not know."""

    def __init__(self, error: MCPError) -> None:
        super().__init__(error.message)
        self.error = error


@dataclass(frozen=True)
class ServerSpec:
    """One MCP server as the catalogue names it: the key its session is shared by.

    ``command`` (stdio) or ``url`` (streamable HTTP); the environment and the
    headers are named, never valued: values are read when the session starts.
    """

    command: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    pass_env: tuple[str, ...] = ()
    url: str | None = None
    headers_from_env: tuple[tuple[str, str], ...] = ()
    #: The sandbox a stdio server runs in (``runtime/sandbox.py``); None: none.
    sandbox: Sandbox | None = None

    def describe(self) -> str:
        """The server for people: its URL or its command line."""
        return self.url if self.url is not None else " ".join(self.command)


def stdio_environment(spec: ServerSpec) -> dict[str, str]:
    """A stdio server's environment: the command tools' minimal one, ``pass_env``, ``env``."""
    names = (*BASE_ENV, *spec.pass_env)
    env = {name: os.environ[name] for name in names if name in os.environ}
    # "python" in a server command means the worker's own interpreter, as for command tools
    # (where the tool user can run it: else the first on PATH it can).
    path = env.get("PATH", os.defpath)
    if COMMAND_KIND.own_python:
        path = os.pathsep.join([os.path.dirname(sys.executable), path])
    env["PATH"] = path
    env.setdefault("PYTHONPATH", os.getcwd())
    env.update(spec.env)
    return env


def shepherded(command: tuple[str, ...], user: ToolUser | None) -> list[str]:
    """The interpreter's arguments that run a stdio server under its shepherd, as ``user``.

    As for a command tool: the server starts a session of its own, as the tool user
    (no supplementary groups), and when it ends, or its session is closed (the SDK
    stops the shepherd), or this process dies (the shepherd's parent-death signal),
    the shepherd kills every process the server left behind.
    """
    owner = [str(user.uid), str(user.gid)] if user is not None else ["-", "-"]
    lifetime = repr(SERVER_LIFETIME_S)
    return ["-I", "-S", SHEPHERD, "-", str(os.getpid()), lifetime, *owner, "--", *command]


def _first_leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _reason(exc: BaseException | None) -> str:
    leaf = _first_leaf(exc) if exc is not None else None
    if leaf is None:
        return "the server stopped"
    if isinstance(leaf, TimeoutError):
        return f"no answer to initialize within {START_TIMEOUT_S:g}s"
    if isinstance(leaf, MCPError):
        return f"the server closed the connection while starting ({leaf.message})"
    return f"{type(leaf).__name__}: {leaf}"


class _StderrFile:
    """Where a stdio server writes its stderr: a temporary file, read without moving its offset.

    The server shares the file's offset; the file is in append mode, so it always
    writes at the end, and it is cut back to its tail when it grows past ``_STDERR_KEEP``.
    """

    def __init__(self) -> None:
        raw = tempfile.TemporaryFile("w+b", buffering=0)  # noqa: SIM115  # closed with the session
        flags = fcntl.fcntl(raw.fileno(), fcntl.F_GETFL)
        fcntl.fcntl(raw.fileno(), fcntl.F_SETFL, flags | os.O_APPEND)
        self.file = cast(TextIO, raw)  # the SDK only hands its descriptor to the server
        self._kept = ""

    def _last_bytes(self) -> bytes:
        fd = self.file.fileno()
        size = os.fstat(fd).st_size
        start = max(size - 4 * STDERR_TAIL_CHARS, 0)
        return os.pread(fd, size - start, start)

    def tail(self) -> str:
        """The last characters written (kept after ``close``)."""
        if self.file.closed:
            return self._kept
        return self._last_bytes().decode("utf-8", errors="replace")[-STDERR_TAIL_CHARS:]

    def trim(self) -> None:
        """Cut the file back to its tail once it has grown past ``_STDERR_KEEP`` bytes."""
        if not self.file.closed and os.fstat(self.file.fileno()).st_size > _STDERR_KEEP:
            kept = self._last_bytes()
            os.ftruncate(self.file.fileno(), 0)
            os.write(self.file.fileno(), kept)

    def close(self) -> None:
        """Keep the tail and close the file."""
        self._kept = self.tail()
        self.file.close()


class _Connection:
    """One session, held open by its own task on the pool's loop until it is closed or lost."""

    def __init__(self, spec: ServerSpec) -> None:
        self.spec = spec
        self.session: ClientSession | None = None
        self.failure: BaseException | None = None
        self.alive = True
        self.settled = asyncio.Event()  # started, or failed to
        self.closing = asyncio.Event()
        self.meter = Meter(self.close)  # past the limit: the session is closed
        self._stderr = _StderrFile() if spec.command else None
        self.task = asyncio.get_running_loop().create_task(self._hold())

    def stderr_tail(self) -> str:
        """The end of what a stdio server wrote on stderr."""
        return self._stderr.tail() if self._stderr is not None else ""

    def after_call(self) -> None:
        """Keep a long-lived server's stderr file small."""
        if self._stderr is not None:
            self._stderr.trim()

    def close(self) -> None:
        """Stop the session (its task leaves the transport and stops a stdio server)."""
        self.alive = False
        self.closing.set()

    async def _hold(self) -> None:
        try:
            async with self._transport() as (read, write), ClientSession(read, write) as session:
                with anyio.fail_after(START_TIMEOUT_S):
                    await session.initialize()
                self.session = session
                self.settled.set()
                await self.closing.wait()
        except Exception as exc:  # the transport's or the session's: the reason it is not usable
            self.failure = exc
        finally:
            self.alive = False
            self.settled.set()
            if self._stderr is not None:
                self._stderr.close()

    @asynccontextmanager
    async def _transport(self) -> AsyncIterator[_Streams]:
        if self.spec.url is not None:
            async with self._http() as streams:
                yield streams
            return
        assert self._stderr is not None
        user = COMMAND_KIND.user
        with scratch_folder(user) as scratch, contextlib.ExitStack() as stack:
            env = stdio_environment(self.spec)
            if user is not None:  # the worker's home and temporary folder are not the user's
                env["HOME"] = env["TMPDIR"] = scratch
            command = list(self.spec.command)
            if self.spec.sandbox is not None:  # the kind checked that one can be made
                sandboxing = COMMAND_KIND.sandboxing
                bwrap = sandboxing.require(self.spec.describe(), user)
                python = forwarder_python(COMMAND_KIND.own_python)
                command, added = stack.enter_context(
                    sandboxing.wrapped(
                        bwrap,
                        command,
                        self.spec.sandbox,
                        scratch,
                        tool=self.spec.describe(),
                        python=python,
                    )
                )
                env = sandboxed_environment(env, added)
            argv = [sys.executable, *shepherded(tuple(command), user)]
            async with stdio_transport(argv, env, self._stderr.file, self.meter) as (read, write):
                # Relay what the server says, to see its end: an idle server that exits
                # marks the session dead, so the next call starts it again.
                send, relayed = anyio.create_memory_object_stream[SessionMessage | Exception](0)
                async with anyio.create_task_group() as relay:
                    relay.start_soon(self._relay, read, send)
                    yield relayed, write
                    relay.cancel_scope.cancel()

    @asynccontextmanager
    async def _http(self) -> AsyncIterator[_Streams]:
        import httpx2  # the SDK's HTTP client; only HTTP sessions need it

        headers = {header: os.environ[var] for header, var in self.spec.headers_from_env}
        timeout = httpx2.Timeout(_HTTP_TIMEOUT_S, read=_HTTP_READ_TIMEOUT_S)
        hooks = {"response": [bound_http(self.meter)]}
        assert self.spec.url is not None
        async with (
            httpx2.AsyncClient(
                headers={**headers, **IDENTITY}, timeout=timeout, event_hooks=hooks
            ) as http,
            # One event of a stream is as large as an answer may be (the SDK's own cap: 1 MiB).
            streamable_http_client(
                self.spec.url, http_client=http, max_sse_event_size=default_output_limit()
            ) as (read, write),
        ):
            yield read, write

    async def _relay(self, read: Any, send: ObjectSendStream[SessionMessage | Exception]) -> None:
        async with send:
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                async for message in read:
                    await send.send(message)
        self.close()


class SessionPool:
    """The sessions of one process, on a loop of their own in a daemon thread."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._loop = asyncio.new_event_loop()
        self._connections: dict[ServerSpec, _Connection] = {}  # used on the loop only
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="mcp-sessions", daemon=True
        )
        self._thread.start()

    def call(
        self,
        spec: ServerSpec,
        name: str,
        arguments: dict[str, Any],
        timeout_s: float,
        limit_bytes: int | None = None,
        meta: dict[str, Any] | None = None,
    ) -> types.CallToolResult:
        """Call tool ``name`` of the server ``spec`` within ``timeout_s``.

        ``limit_bytes``: the most the server may send during the call (None: the process's
        default output limit). ``meta``: the request's ``_meta`` (a trace context).

        Raises:
            ServerUnavailable: the server did not start, or not in time.
            ConnectionLost: the server went away during the call.
            CallTimedOut: no answer by the deadline; the request was cancelled.
            AnswerTooLarge: the server sent more than ``limit_bytes``; the session was closed.
            MCPError: the server answered the request with a JSON-RPC error.
        """
        limit = default_output_limit() if limit_bytes is None else limit_bytes
        future = asyncio.run_coroutine_threadsafe(
            self._call(spec, name, arguments, timeout_s, limit, meta), self._loop
        )
        try:
            return future.result(timeout_s + _BACKSTOP_S)
        except concurrent.futures.TimeoutError:  # the loop itself did not answer
            raise CallTimedOut from None
        finally:
            future.cancel()  # a caller interrupted (a signal) takes its call with it

    async def _call(
        self,
        spec: ServerSpec,
        name: str,
        arguments: dict[str, Any],
        timeout_s: float,
        limit: int,
        meta: dict[str, Any] | None = None,
    ) -> types.CallToolResult:
        deadline = anyio.current_time() + timeout_s
        try:
            return await self._call_once(spec, name, arguments, deadline, limit, meta)
        except _SessionExpired:
            # MCP: a 404 for a session means the server no longer knows it (it restarted)
            # and did not run the request; the client starts a new session. Once.
            pass
        try:
            return await self._call_once(spec, name, arguments, deadline, limit, meta)
        except _SessionExpired as exc:
            raise exc.error from None

    async def _call_once(
        self,
        spec: ServerSpec,
        name: str,
        arguments: dict[str, Any],
        deadline: float,
        limit: int,
        meta: dict[str, Any] | None = None,
    ) -> types.CallToolResult:
        connection = self._connection(spec)
        with connection.meter.call(limit) as call:
            try:
                return await self._call_on(connection, name, arguments, deadline, meta)
            except Exception:  # whatever the session made of it: the answer was too large
                if connection.meter.over(call):
                    raise AnswerTooLarge(limit) from None
                raise

    async def _call_on(
        self,
        connection: _Connection,
        name: str,
        arguments: dict[str, Any],
        deadline: float,
        meta: dict[str, Any] | None = None,
    ) -> types.CallToolResult:
        spec = connection.spec
        session = await self._started(connection, deadline - anyio.current_time())
        try:
            with anyio.fail_after(max(deadline - anyio.current_time(), 0)):
                result = await session.call_tool(name, arguments, meta=meta or None)  # type: ignore[arg-type]
        except TimeoutError:
            raise CallTimedOut from None
        except MCPError as exc:
            if spec.url is not None and exc.code == types.INVALID_REQUEST:
                connection.close()
                raise _SessionExpired(exc) from None
            if exc.code != types.CONNECTION_CLOSED and connection.alive:
                raise  # the server's own answer to this request
            connection.close()
            raise ConnectionLost(connection.stderr_tail()) from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
            connection.close()
            raise ConnectionLost(connection.stderr_tail()) from None
        connection.after_call()
        return result

    def _connection(self, spec: ServerSpec) -> _Connection:
        connection = self._connections.get(spec)
        if connection is None or not connection.alive:
            connection = self._connections[spec] = _Connection(spec)
        return connection

    @staticmethod
    async def _started(connection: _Connection, timeout_s: float) -> ClientSession:
        with anyio.move_on_after(max(timeout_s, 0)):
            await connection.settled.wait()
        if not connection.settled.is_set():  # still starting: later calls find it ready
            raise ServerUnavailable(f"it did not finish starting within {timeout_s:g}s")
        if connection.session is None or not connection.alive:
            raise ServerUnavailable(_reason(connection.failure), connection.stderr_tail())
        return connection.session

    def close(self) -> None:
        """Stop every session and the loop; a pool inherited from a parent is left alone."""
        if self.pid != os.getpid() or self._loop.is_closed():
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._close_all(), self._loop).result(CLOSE_TIMEOUT_S)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CLOSE_TIMEOUT_S)
        if not self._thread.is_alive():
            self._loop.close()

    async def _close_all(self) -> None:
        tasks = [connection.task for connection in self._connections.values()]
        for connection in self._connections.values():
            connection.close()
        self._connections.clear()
        if tasks:
            await asyncio.wait(tasks, timeout=CLOSE_TIMEOUT_S - 1)


_pool: SessionPool | None = None
#: Pools a forked child inherited: never used, never collected (their servers are the parent's).
_inherited: list[SessionPool] = []
_lock = threading.Lock()
_closing_registered = False


def sessions() -> SessionPool:
    """This process's pool, started on first use (and again in a forked child)."""
    global _pool, _closing_registered
    pool = _pool
    if pool is not None and pool.pid == os.getpid():
        return pool
    with _lock:
        if _pool is not None and _pool.pid != os.getpid():
            _inherited.append(_pool)
            _pool = None
        if _pool is None:
            _pool = SessionPool()
            if not _closing_registered:
                atexit.register(close_sessions)
                _closing_registered = True
        return _pool


def close_sessions() -> None:
    """Stop this process's MCP sessions and their stdio servers (at exit, or when asked)."""
    global _pool
    with _lock:
        pool, _pool = _pool, None
    if pool is not None and pool.pid == os.getpid():
        pool.close()
    elif pool is not None:
        _inherited.append(pool)
