"""``cleveragents mcp serve``: load the catalogue, start what the queue needs, serve MCP.

With no broker configured (the embedded default) a local worker runs for as
long as the server does, as ``submit --wait`` does, so a one-line MCP host
config works on one machine. Over stdio nothing but the protocol reaches stdout
(the SDK points fd 1 at stderr while it serves; logs go to stderr).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from cleveragents.client import SkillClient
from cleveragents.embedded.runner import LocalWorker
from cleveragents.mcp.http import (
    DEFAULT_HOST,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_MAX_SESSIONS_PER_CLIENT,
    DEFAULT_PORT,
    DEFAULT_SESSION_IDLE_TIMEOUT,
    MCP_PATH,
    TOKEN_ENV,
    check_http_options,
    guarded_app,
)
from cleveragents.mcp.naming import ToolTable
from cleveragents.mcp.server import FleetTools, build_server
from cleveragents.mcp.stdio import pipe_lines
from cleveragents.runtime.kinds import load_tool_kinds
from cleveragents.settings import Settings
from cleveragents.skills import Catalogue

__all__ = ["ServeOptions", "load_table", "serve"]

log = logging.getLogger("cleveragents.mcp")

Transport = Literal["stdio", "http"]


@dataclass(frozen=True)
class ServeOptions:
    """How ``mcp serve`` serves: transport, address, writes, HTTP sessions and token."""

    transport: Transport = "stdio"
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    allow_writes: bool = False
    #: An MCP client's elicitation answer may approve or reject a parked call (the operator's
    #: opt-in: the answer is the client program's word, not a person's).
    approve_over_mcp: bool = False
    #: HTTP: open sessions kept at most; the least recently used idle one makes room.
    max_sessions: int = DEFAULT_MAX_SESSIONS
    #: HTTP: open sessions one client (peer address) keeps at most; its own idle one makes room.
    max_sessions_per_client: int = DEFAULT_MAX_SESSIONS_PER_CLIENT
    #: HTTP: seconds a session may go without a request in flight before it is closed.
    session_idle_timeout: float = DEFAULT_SESSION_IDLE_TIMEOUT
    #: The bearer token HTTP clients must send (``CLEVERAGENTS_MCP_TOKEN``); never logged.
    token: str | None = field(default=None, repr=False)


def _log_to_stderr() -> None:
    logger = logging.getLogger("cleveragents.mcp")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("cleveragents mcp: %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def load_table(settings: Settings) -> ToolTable:
    """The MCP tools of the configured catalogue; its problems are logged, not fatal.

    Raises:
        ConfigurationError: a ``CLEVERAGENTS_TOOL_KINDS`` module cannot be loaded.
    """
    # Plugin kinds first, as workers and `skills` commands do: the catalogue may use them.
    load_tool_kinds(settings.tool_kinds)
    catalogue = Catalogue.from_paths(*settings.catalogue_paths)
    for problem in catalogue.errors:
        log.warning("catalogue: %s", problem)
    table = ToolTable.from_catalogue(catalogue)
    for reason in table.skipped:
        log.warning("not served: %s", reason)
    return table


class _Stop(BaseException):
    """Raised in the main thread by SIGTERM or SIGHUP outside the event loop."""


def _raise_stop(signum: int, frame: object) -> None:
    raise _Stop(signum)


#: Signals that stop the server through its cleanup (SIGINT is Python's KeyboardInterrupt).
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _stop_on_signals() -> None:
    """SIGTERM and SIGHUP end ``serve`` through its cleanup (the local worker is stopped)."""
    for signum in _STOP_SIGNALS:
        signal.signal(signum, _raise_stop)


@contextlib.contextmanager
def _stopped_by_signals() -> Iterator[None]:
    """While the block runs, SIGTERM and SIGHUP end it cleanly; then the old handlers return."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers; the caller handles its signals
        return
    previous = {signum: signal.getsignal(signum) for signum in _STOP_SIGNALS}
    _stop_on_signals()
    try:
        yield
    except _Stop as stop:
        log.info("stopped by %s", signal.Signals(stop.args[0]).name)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


@contextlib.contextmanager
def _local_worker(settings: Settings) -> Iterator[None]:
    """On the embedded default, the home's local worker for the block (``LocalWorker``).

    A signal that lands while it starts still stops it (``LocalWorker.start`` cleans
    up on any exception); at the end it is killed at once when it holds nothing, or
    given a warm shutdown so that a running tool (a write above all) can finish.
    """
    if not settings.embedded:
        yield
        return
    log.info("no broker configured: starting a local worker (embedded default)")
    with LocalWorker(settings):
        yield


def serve(options: ServeOptions, settings: Settings) -> None:
    """Serve the catalogue over MCP until the client goes away or a signal stops it.

    Raises:
        ConfigurationError: HTTP on a non-loopback host without a token, or bad settings.
    """
    if options.transport == "http":
        check_http_options(options.host, options.token, options.port)
    _log_to_stderr()
    with _stopped_by_signals():
        table = load_table(settings)
        with SkillClient(settings=settings) as client:
            tools = FleetTools(table, client, allow_writes=options.allow_writes,
                               approve_over_mcp=options.approve_over_mcp)
            with _local_worker(settings):
                writes = "allowed" if options.allow_writes else "refused (no --allow-writes)"
                log.info("serving %d tools over %s; writes %s", len(table), options.transport,
                         writes)
                if options.approve_over_mcp:
                    log.warning("--approve-over-mcp: an MCP client's elicitation answer decides "
                                "parked calls, recorded as by mcp-client:<the name it gives>")
                _run(build_server(tools), options)


def _run(server: Server[Any], options: ServeOptions) -> None:
    try:
        if options.transport == "http":
            anyio.run(_serve_http, server, options)
        else:
            anyio.run(_serve_stdio, server)
    finally:
        # The event loop put its own signal handlers back to the defaults.
        if threading.current_thread() is threading.main_thread():
            _stop_on_signals()


async def _stop_on(scope: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signum in signals:
            log.info("stopping on %s", signal.Signals(signum).name)
            scope.cancel()
            return


async def _serve_stdio(server: Server[Any]) -> None:
    async with anyio.create_task_group() as group:
        if threading.current_thread() is threading.main_thread():
            group.start_soon(_stop_on, group.cancel_scope)
        async with stdio_server(stdin=pipe_lines(0)) as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
        group.cancel_scope.cancel()


async def _serve_http(server: Server[Any], options: ServeOptions) -> None:
    import uvicorn  # only the HTTP transport needs it
    from mcp.server.transport_security import TransportSecuritySettings

    sdk_app = server.streamable_http_app(
        streamable_http_path=MCP_PATH,
        host=options.host,
        # Host and Origin are checked in one place, HostGuard, for every loopback spelling;
        # the SDK's own check covers only three of them and would refuse reverse proxies.
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        session_idle_timeout=options.session_idle_timeout,
        # SessionLimit keeps max_sessions; the SDK's limit is only a backstop.
        max_sessions=2 * options.max_sessions,
    )
    app = guarded_app(sdk_app, host=options.host, token=options.token,
                      max_sessions=options.max_sessions,
                      idle_timeout=options.session_idle_timeout,
                      max_per_client=options.max_sessions_per_client)
    if not options.token:
        log.warning("%s is not set: any local process may call the tools", TOKEN_ENV)
    # No proxy headers: a session counts against its connection's own peer address, which a
    # client cannot choose; uvicorn would otherwise take X-Forwarded-For from any local client.
    config = uvicorn.Config(
        app, host=options.host, port=options.port, log_level="warning", lifespan="on",
        proxy_headers=False,
    )
    log.info("listening on http://%s:%d%s", options.host, options.port, MCP_PATH)
    await uvicorn.Server(config).serve()
