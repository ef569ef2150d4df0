"""What the MCP tests share: `cleveragents mcp serve` subprocesses and the SDK's own client."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TextIO, TypeVar

import anyio
import httpx2
import pytest
import redis
from anyio.from_thread import BlockingPortal
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from cleveragents.client import SkillClient
from cleveragents.settings import Settings
from tests.support.procs import EXAMPLE_SKILLS, REPO, Worker, free_port, kill_group, wait_until

T = TypeVar("T")

#: The catalogue of the MCP tests: skill test/mcp, then the bundled examples.
MCP_SKILLS = REPO / "tests" / "fixtures" / "mcp_skills"
CATALOGUE = os.pathsep.join([str(MCP_SKILLS), str(EXAMPLE_SKILLS)])
#: The console script of this environment.
CLEVERAGENTS = str(Path(sys.executable).with_name("cleveragents"))
#: The Redis database of the MCP tests (the per-test `redis_url` fixture flushes database 0).
MCP_DB = 7
#: Set when the tests use an existing Redis (tests/conftest.py); then its database is used.
EXTERNAL_REDIS = bool(os.environ.get("CLEVERAGENTS_TEST_REDIS_URL"))

ECHO = "test_mcp__test_echo"
SLOW_READ = "test_mcp__test_slow-read"
SLOW_WRITE = "test_mcp__test_slow-write"
WORD_COUNT = "local_text-tools__local_word-count"
#: A raw JSON-RPC initialize request (for tests that speak HTTP or stdio by hand).
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"},
    },
}


@dataclass(frozen=True)
class Fleet:
    """A Redis database and one real worker on it, shared by the tests of one module."""

    broker: str
    worker: Worker

    def client(self) -> SkillClient:
        """A producer client on the fleet's Redis."""
        return SkillClient(settings=Settings.from_env({"CLEVERAGENTS_BROKER_URL": self.broker}))


@contextmanager
def running_fleet(session_redis_url: str) -> Iterator[Fleet]:
    """Start a worker with the MCP catalogue on a database of the session's Redis.

    On the private test Redis that is database ``MCP_DB``; on an external one
    (``CLEVERAGENTS_TEST_REDIS_URL``) the database it names, which the tests own.
    """
    broker = session_redis_url
    if not EXTERNAL_REDIS:
        broker = session_redis_url.rsplit("/", 1)[0] + f"/{MCP_DB}"
    redis.Redis.from_url(broker).flushdb()
    worker = Worker(
        {
            "CLEVERAGENTS_BROKER_URL": broker,
            "CLEVERAGENTS_RESULT_BACKEND": broker,
            "CLEVERAGENTS_CATALOGUE": CATALOGUE,
        },
        concurrency=2,
    ).start()
    try:
        yield Fleet(broker, worker)
    finally:
        worker.stop()


def serve_env(broker: str | None, **extra: str) -> dict[str, str]:
    """The whole environment of an `mcp serve` process (the SDK passes only what it is given)."""
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/tmp"),
        "PYTHONPATH": str(REPO),
        "CLEVERAGENTS_CATALOGUE": CATALOGUE,
    }
    if broker is not None:
        env["CLEVERAGENTS_BROKER_URL"] = broker
        env["CLEVERAGENTS_RESULT_BACKEND"] = broker
    env.update(extra)
    return env


@asynccontextmanager
async def stdio_session(
    *args: str, env: dict[str, str], errlog: TextIO, cwd: Path = REPO
) -> AsyncIterator[ClientSession]:
    """An initialized client session with `cleveragents mcp serve ARGS` over stdio."""
    params = StdioServerParameters(
        command=CLEVERAGENTS, args=["mcp", "serve", *args], env=env, cwd=cwd
    )
    async with (
        stdio_client(params, errlog=errlog) as (read, write),
        ClientSession(read, write) as session,
    ):
        with anyio.fail_after(120):
            await session.initialize()
        yield session


@dataclass(frozen=True)
class Served:
    """A client session with one `mcp serve` process, held open in a portal's event loop.

    Sync tests call through the portal, so several tests share one server (each
    spawn costs a second or more of imports).
    """

    session: ClientSession
    portal: BlockingPortal
    log: Path

    def call(self, name: str, arguments: dict[str, Any], **options: Any) -> Any:
        """``tools/call`` and its result."""
        return self.portal.call(partial(self.session.call_tool, name, arguments, **options))

    def run(self, scenario: Callable[[ClientSession], Awaitable[T]]) -> T:
        """Run an async scenario against the session."""
        return self.portal.call(scenario, self.session)

    def log_text(self) -> str:
        """What the server wrote on stderr so far."""
        return self.log.read_text(errors="replace")


@contextmanager
def served(portal: BlockingPortal, broker: str | None, log: Path, *args: str) -> Iterator[Served]:
    """`cleveragents mcp serve ARGS` over stdio for as long as the block runs."""
    with log.open("w") as errlog, portal.wrap_async_context_manager(
        stdio_session(*args, env=serve_env(broker), errlog=errlog)
    ) as session:
        yield Served(session, portal, log)


@asynccontextmanager
async def http_session(url: str, token: str | None) -> AsyncIterator[ClientSession]:
    """An initialized client session over streamable HTTP, sending ``token`` when given."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        httpx2.AsyncClient(headers=headers) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        with anyio.fail_after(60):
            await session.initialize()
        yield session


async def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``predicate`` from async code; fail the test after ``timeout`` seconds."""
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.05)
    assert predicate(), what


@dataclass
class HttpServer:
    """A `cleveragents mcp serve --transport http` process."""

    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@contextmanager
def http_server(env: dict[str, str], log: Path, *args: str) -> Iterator[HttpServer]:
    """Start `mcp serve --transport http` on a free port; wait until it accepts connections."""
    port = free_port()
    with log.open("ab") as sink:
        proc = subprocess.Popen(
            [CLEVERAGENTS, "mcp", "serve", "--transport", "http", "--port", str(port), *args],
            env=env, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
        )
    server = HttpServer(proc, port, log)
    try:
        wait_until(lambda: _listens(port) or proc.poll() is not None, 60, "mcp serve on HTTP")
        if proc.poll() is not None:
            pytest.fail(f"mcp serve exited early:\n{server.log_text()}")
        yield server
    finally:
        kill_group(proc)
        proc.wait(10)


def _listens(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def text_of(result: Any) -> str:
    """The text blocks of a ``CallToolResult``, joined."""
    return "\n".join(block.text for block in result.content if getattr(block, "text", None))


def wait_file(path: Path, timeout: float = 30) -> None:
    """Wait until ``path`` exists."""
    wait_until(path.exists, timeout, f"{path} to exist")

