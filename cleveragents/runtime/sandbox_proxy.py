"""The sandbox's proxy: the only way out of a sandbox whose ``network`` is a list.

The worker process that runs a sandboxed tool serves an HTTP proxy for it on a
Unix socket in the tool's scratch folder (the forwarder inside the sandbox,
``sandbox_forwarder.py``, makes it ``127.0.0.1:PORT`` there). Two requests are
understood: ``CONNECT host:port`` (HTTPS and any other TCP, tunnelled as is)
and a plain HTTP request in absolute form (``GET http://host/path``), sent on to
the host in origin form. A destination the tool's ``Sandbox`` does not allow
(matched by the name asked for, not by its address) is answered ``403`` and
logged with the tool, the host and the port: never the path, the query or the
headers, where a tool's arguments may be.

The proxy of a process runs on one event loop in a daemon thread, started on first
use (again in a forked child); each sandboxed call or stdio MCP session opens its
own socket with its own rules (``open_proxy``) and closes it when it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from urllib.parse import urlsplit

from cleveragents.skills.policies import Sandbox

__all__ = ["HEAD_LIMIT", "open_proxy"]

log = logging.getLogger("cleveragents.sandbox")

#: The most bytes a request's head (request line and headers) may have.
HEAD_LIMIT = 64 * 1024
#: How long a client may take to send its request's head, and the proxy to connect.
_HEAD_TIMEOUT_S = _CONNECT_TIMEOUT_S = 30.0
_CHUNK = 65_536
#: Headers meant for the proxy itself, not sent on.
_HOP_HEADERS = ("proxy-connection", "proxy-authorization", "connection", "keep-alive")


class _Loop:
    """This process's proxy loop, in a daemon thread."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        thread = threading.Thread(target=self.loop.run_forever, name="sandbox-proxy", daemon=True)
        thread.start()


_loop: _Loop | None = None
_lock = threading.Lock()


def _current() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is None or _loop.pid != os.getpid():  # a forked child: its own thread
            _loop = _Loop()
        return _loop.loop


@contextlib.contextmanager
def open_proxy(path: str, rules: Sandbox, tool: str) -> Iterator[None]:
    """Serve a proxy for ``tool`` on a Unix socket at ``path`` while the block runs.

    The socket is open to every user (``0o666``): the folder it is in decides who
    reaches it (a scratch folder is its tool user's alone).
    """
    loop = _current()
    tunnels: set[asyncio.Task[None]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        tunnels.add(task)
        try:
            await _serve(reader, writer, rules, tool)
        finally:
            tunnels.discard(task)

    async def start() -> asyncio.Server:
        server = await asyncio.start_unix_server(handle, path=path, limit=HEAD_LIMIT)
        os.chmod(path, 0o666)
        return server

    server = asyncio.run_coroutine_threadsafe(start(), loop).result()
    try:
        yield
    finally:

        async def stop() -> None:
            server.close()
            for task in list(tunnels):  # its open tunnels end with it
                task.cancel()

        asyncio.run_coroutine_threadsafe(stop(), loop).result()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _target(method: str, target: str) -> tuple[str, int, str]:
    """(host, port, origin-form path) of a request's target; ValueError when it has none."""
    if method == "CONNECT":
        parts = urlsplit("//" + target)
        if not parts.hostname or parts.port is None:
            raise ValueError(target)
        return parts.hostname, parts.port, ""
    parts = urlsplit(target)
    if parts.scheme.lower() != "http" or not parts.hostname:
        raise ValueError(target)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.hostname, parts.port or 80, path


async def _answer(writer: asyncio.StreamWriter, status: str) -> None:
    body = f"{status}\n".encode()
    writer.write(
        f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n".encode()
        + body
    )
    with contextlib.suppress(OSError):
        await writer.drain()
    writer.close()


async def _serve(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, rules: Sandbox, tool: str
) -> None:
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _HEAD_TIMEOUT_S)
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, OSError):
        writer.close()
        return
    request_line, *headers = head.decode("latin-1").split("\r\n")
    method, _, rest = request_line.partition(" ")
    target, _, version = rest.partition(" ")
    try:
        host, port, path = _target(method.upper(), target)
    except ValueError:
        await _answer(writer, "400 Bad Request")
        return
    if not rules.allows(host, port):
        log.warning(
            "sandbox proxy refused %s:%d for tool %s (not an allowed destination)", host, port, tool
        )
        await _answer(writer, "403 Forbidden")
        return
    try:
        up_reader, up_writer = await asyncio.wait_for(
            asyncio.open_connection(host, port), _CONNECT_TIMEOUT_S
        )
    except (OSError, TimeoutError):
        await _answer(writer, "502 Bad Gateway")
        return
    if method.upper() == "CONNECT":
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
    else:
        kept = [h for h in headers if h and h.split(":", 1)[0].strip().lower() not in _HOP_HEADERS]
        up_writer.write(
            f"{method} {path} {version}\r\n".encode("latin-1")
            + "".join(f"{h}\r\n" for h in kept).encode("latin-1")
            + b"Connection: close\r\n\r\n"
        )
    try:
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
    finally:
        up_writer.close()
        writer.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        writer.close()
