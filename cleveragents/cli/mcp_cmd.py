"""``cleveragents mcp serve`` and ``cleveragents skills import --from-mcp``.

The MCP SDK takes about a second to import: it is imported only when one of
these commands runs, never by ``cleveragents --help`` or the other commands.
"""

from __future__ import annotations

import re
import shlex
import sys

import click

from cleveragents.cli.broker_check import require_reachable
from cleveragents.cli.render import CliFailure
from cleveragents.settings import Settings
from cleveragents.skills.model import NAME_PATTERN

__all__ = ["mcp", "skills_import"]

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@click.group("mcp")
def mcp() -> None:
    """Serve the catalogue to MCP hosts: agents call the fleet over MCP."""


@mcp.command("serve")
@click.option(
    "--transport",
    type=click.Choice(["stdio", "http"]),
    default="stdio",
    show_default=True,
    help="stdio for a desktop MCP host; http for streamable HTTP at /mcp.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="HTTP: address to bind.")
@click.option(
    "--port", type=click.IntRange(1, 65535), default=8765, show_default=True, help="HTTP: port."
)
@click.option("--allow-writes", is_flag=True, help="Let write-capable tools run.")
@click.option(
    "--approve-over-mcp",
    is_flag=True,
    help="Let an MCP client's elicitation answer approve or reject a call that awaits "
    "approval (the client program's word, recorded as mcp-client:<name>). Without it a "
    "person approves with `cleveragents approvals approve ID`.",
)
@click.option(
    "--max-sessions",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="HTTP: open sessions kept at most; the least recently used idle one makes room.",
)
@click.option(
    "--max-sessions-per-client",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    help="HTTP: open sessions one client (peer address) keeps at most; its own least "
    "recently used idle one makes room, never another client's.",
)
@click.option(
    "--session-idle-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=300.0,
    show_default=True,
    metavar="SECONDS",
    help="HTTP: close a session after this long without a request in flight.",
)
def serve_command(
    transport: str,
    host: str,
    port: int,
    allow_writes: bool,
    approve_over_mcp: bool,
    max_sessions: int,
    max_sessions_per_client: int,
    session_idle_timeout: float,
) -> None:
    """Serve every skill's tools over MCP; each call runs as an invocation on the fleet.

    Over HTTP, clients send Authorization: Bearer $CLEVERAGENTS_MCP_TOKEN; off
    loopback the server refuses to start without that token. On loopback without
    it, requests whose Host or Origin is not this server are refused.
    """
    from cleveragents.mcp.serve import ServeOptions, serve

    settings = Settings.from_env()
    require_reachable(settings)  # a wrong URL: one line now, not a hang at the first call
    options = ServeOptions(
        transport="http" if transport == "http" else "stdio",
        host=host,
        port=port,
        allow_writes=allow_writes,
        approve_over_mcp=approve_over_mcp,
        max_sessions=max_sessions,
        max_sessions_per_client=max_sessions_per_client,
        session_idle_timeout=session_idle_timeout,
        token=settings.mcp_token,
    )
    serve(options, settings)


def _headers(pairs: tuple[str, ...]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for pair in pairs:
        header, _, variable = pair.partition("=")
        if not header or not _ENV_NAME.match(variable):
            raise CliFailure(f"--header-from-env wants HEADER=ENV_VAR, got {pair!r}")
        headers[header] = variable
    return headers


@click.command("import", context_settings={"ignore_unknown_options": True})
@click.option("--from-mcp", "from_mcp", is_flag=True, help="Import an MCP server's tools.")
@click.option("--command", "command", metavar="CMD", help="Start the server with CMD (stdio).")
@click.option("--url", metavar="URL", help="Reach the server at URL (streamable HTTP).")
@click.option(
    "--header-from-env",
    "header_pairs",
    multiple=True,
    metavar="HEADER=VAR",
    help="With --url: send HEADER with the value of $VAR (repeatable).",
)
@click.option("--name", required=True, help="The skill's name, like team/skill.")
@click.argument("command_args", nargs=-1, type=click.UNPROCESSED)
def skills_import(
    from_mcp: bool,
    command: str | None,
    url: str | None,
    header_pairs: tuple[str, ...],
    name: str,
    command_args: tuple[str, ...],
) -> None:
    """Print a skill file whose tools are a remote MCP server's tools.

    The command may be quoted (--command "python -m server") or follow --command
    as separate words (--command python -m server).
    """
    if not from_mcp:
        raise CliFailure("say where the tools come from: --from-mcp")
    if (command is None) == (url is None):
        raise CliFailure("give exactly one of --command and --url")
    if command_args and command is None:
        raise CliFailure(f"unexpected arguments: {' '.join(command_args)}")
    if not re.match(NAME_PATTERN, name):
        raise CliFailure(f"--name {name!r} must be namespaced, like team/skill")
    from cleveragents.mcp.importer import RemoteServer, import_skill

    argv = (*shlex.split(command), *command_args) if command is not None else ()
    if command is not None and not argv:
        raise CliFailure("--command is empty")
    remote = RemoteServer(command=argv, url=url, headers_from_env=_headers(header_pairs))
    sys.stdout.write(import_skill(name, remote))
    sys.stdout.flush()
