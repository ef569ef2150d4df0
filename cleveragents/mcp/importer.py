"""``cleveragents skills import --from-mcp``: a skill file from an MCP server's ``tools/list``.

Each remote tool becomes one tool of the skill, ``source: mcp`` with the
server (``server: {command: [...]}`` or ``server: {url: ..., headers_from_env:
{...}}``) and ``remote_tool: NAME`` (SPEC section 10). Annotations become the
tool's access, so remote writes are gated from the first run:

| annotation | tool spec |
|---|---|
| ``readOnlyHint`` not ``true`` (false, or absent: MCP's default is false) | ``writes: true`` |
| ``destructiveHint: true`` | ``writes: true`` |
| ``openWorldHint: true`` | ``side_effects: true`` |
| ``idempotentHint: true`` | ``idempotent: true`` |

An absent ``openWorldHint`` is not read as ``true``: a tool that does not say it
is read-only already writes (and is gated); one that does is not gated for a
hint it did not give. ``inputSchema`` and ``outputSchema`` are copied as they are.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import tempfile
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TextIO

import anyio
import yaml
from mcp import ClientSession, StdioServerParameters, stdio_client, types
from mcp.client.streamable_http import streamable_http_client
from pydantic import ValidationError

from cleveragents.errors import ConfigurationError
from cleveragents.skills.model import Skill

__all__ = [
    "IMPORT_TIMEOUT_S",
    "RemoteServer",
    "import_skill",
    "list_remote_tools",
    "refuse_unsafe",
    "skill_document",
    "tool_access",
]

#: How long the remote server may take to start and list its tools.
IMPORT_TIMEOUT_S = 60.0
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class RemoteServer:
    """How to reach an MCP server: a command (stdio) or a URL (streamable HTTP)."""

    command: tuple[str, ...] = ()
    url: str | None = None
    #: HTTP header name -> environment variable holding its value (never the value).
    headers_from_env: Mapping[str, str] = field(default_factory=dict)

    def spec(self) -> dict[str, Any]:
        """The ``server:`` block of each imported tool."""
        if self.url is not None:
            spec: dict[str, Any] = {"url": self.url}
            if self.headers_from_env:
                spec["headers_from_env"] = dict(self.headers_from_env)
            return spec
        return {"command": list(self.command)}

    def describe(self) -> str:
        """The server for people: its URL or its command line."""
        return self.url if self.url is not None else " ".join(self.command)


def tool_access(annotations: types.ToolAnnotations | None) -> dict[str, bool]:
    """``writes``, ``side_effects`` and ``idempotent`` of a tool with these annotations."""
    hints = annotations or types.ToolAnnotations()
    return {
        "writes": hints.read_only_hint is not True or hints.destructive_hint is True,
        "side_effects": hints.open_world_hint is True,
        "idempotent": hints.idempotent_hint is True,
    }


def _tool_names(namespace: str, remote: list[str]) -> list[str]:
    """Catalogue names ``namespace/<remote name>``: unsafe characters as ``-``.

    Names that would clash get 8 hex digits of a SHA-256 of the remote name.
    """
    slugs = [_UNSAFE.sub("-", name).lstrip("._-") or "tool" for name in remote]
    counts = {slug: slugs.count(slug) for slug in slugs}
    return [
        f"{namespace}/{slug}"
        if counts[slug] == 1
        else f"{namespace}/{slug}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"
        for slug, name in zip(slugs, remote, strict=True)
    ]


def _tool_entry(name: str, tool: types.Tool, remote: RemoteServer) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": name,
        "description": tool.description or tool.title or f"MCP tool {tool.name}",
        "source": "mcp",
        "server": remote.spec(),
        "remote_tool": tool.name,
        **tool_access(tool.annotations),
        "input_schema": tool.input_schema,
    }
    if tool.output_schema is not None:
        entry["output_schema"] = tool.output_schema
    return entry


def skill_document(
    name: str, remote: RemoteServer, info: types.Implementation | None, tools: list[types.Tool]
) -> dict[str, Any]:
    """The skill (as YAML-ready data) whose tools are ``tools`` of the server ``remote``."""
    namespace = name.rsplit("/", 1)[0]
    server_name = info.name if info is not None else remote.describe()
    names = _tool_names(namespace, [tool.name for tool in tools])
    return {
        "name": name,
        "description": f"Tools of the MCP server {server_name}",
        "version": (info.version if info is not None and info.version else "0.0.0"),
        "tools": [_tool_entry(n, t, remote) for n, t in zip(names, tools, strict=True)],
    }


@asynccontextmanager
async def _session(
    remote: RemoteServer, errlog: TextIO | None = None
) -> AsyncIterator[ClientSession]:
    if remote.url is not None:
        import httpx2  # the SDK's HTTP client

        headers = {
            header: os.environ[var]
            for header, var in remote.headers_from_env.items()
            if var in os.environ
        }
        async with (
            httpx2.AsyncClient(headers=headers) as http,
            streamable_http_client(remote.url, http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            yield session
        return
    # The command sees this process's whole environment, as if it were run by hand.
    params = StdioServerParameters(
        command=remote.command[0], args=list(remote.command[1:]), env=dict(os.environ)
    )
    async with (
        stdio_client(params, errlog=errlog or sys.stderr) as (read, write),
        ClientSession(read, write) as session,
    ):
        yield session


async def list_remote_tools(
    remote: RemoteServer, errlog: TextIO | None = None
) -> tuple[types.Implementation | None, list[types.Tool]]:
    """The server's ``serverInfo`` and every tool of its ``tools/list`` (all pages);
    a stdio server's stderr goes to ``errlog`` (this process's by default)."""
    async with _session(remote, errlog) as session:
        initialized = await session.initialize()
        tools: list[types.Tool] = []
        cursor: str | None = None
        while True:
            page = await session.list_tools(
                params=types.PaginatedRequestParams(cursor=cursor) if cursor else None
            )
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                return initialized.server_info, tools


#: The end of a server's stderr said when it did not answer: lines, and characters.
STDERR_TAIL_LINES = 5
STDERR_TAIL_CHARS = 800


def _tail(errlog: TextIO) -> str:
    errlog.seek(0)
    text = errlog.read()[-STDERR_TAIL_CHARS:]
    return " | ".join(line.strip() for line in text.strip().splitlines()[-STDERR_TAIL_LINES:])


def _why(leaf: BaseException, remote: RemoteServer, tail: str) -> str:
    """What went wrong, in words: a time-out, a server that exited, or the SDK's reason."""
    if isinstance(leaf, TimeoutError):
        reason = "no answer in time"
    elif remote.url is None and "Connection closed" in str(leaf):
        reason = "the server exited (or closed its stdout) before it answered"
    else:
        reason = str(leaf) or type(leaf).__name__
    if remote.url is None:
        reason += f"; its stderr ends: {tail}" if tail else "; it wrote nothing on stderr"
    return reason


def _first_leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def import_skill(name: str, remote: RemoteServer, *, timeout_s: float = IMPORT_TIMEOUT_S) -> str:
    """The YAML skill file for the tools of ``remote``, named ``name``.

    Raises:
        ConfigurationError: the server could not be started, reached or listed.
    """

    # A stdio server's stderr is kept, and said when it did not answer (a server that
    # exits at once left only the SDK's "Connection closed"); one that answered is quiet.
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as errlog:

        async def listing() -> tuple[types.Implementation | None, list[types.Tool]]:
            with anyio.fail_after(timeout_s):
                return await list_remote_tools(remote, errlog)

        try:
            info, tools = anyio.run(listing)
        except Exception as exc:
            leaf = _first_leaf(exc)
            raise ConfigurationError(
                f"cannot list the tools of MCP server {remote.describe()}: "
                f"{_why(leaf, remote, _tail(errlog))}"
            ) from None
    header = (
        f"# Imported by `cleveragents skills import --from-mcp` from {remote.describe()}.\n"
        "# writes/side_effects/idempotent come from the tools' MCP annotations "
        "(docs/mcp.md); review them.\n"
    )
    document = skill_document(name, remote, info, tools)
    refuse_unsafe(document, remote)
    body = yaml.safe_dump(document, sort_keys=False, allow_unicode=True)
    return header + body


def refuse_unsafe(document: dict[str, Any], remote: RemoteServer) -> None:
    """Refuse a skill a worker would refuse to load, such as a schema that refers outside
    itself: a lying server's schema is never copied into a skill file.

    Raises:
        ConfigurationError: naming the tool and the first problem.
    """
    try:
        Skill.model_validate(document)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        reason = str(first.get("ctx", {}).get("error") or first["msg"])
        raise ConfigurationError(
            f"not imported from MCP server {remote.describe()}: {where}: {reason}"
        ) from None
