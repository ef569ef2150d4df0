"""Agents call the fleet over MCP: ``cleveragents mcp serve`` and ``skills import --from-mcp``.

- ``naming``: the catalogue's MCP tools (as ``skills export --format mcp`` names
  them) and the way back from an MCP name to a skill and tool.
- ``call_results``: ``SkillResult`` to ``CallToolResult``.
- ``server``: the ``tools/list`` and ``tools/call`` handlers; calls run as invocations
  on the queue (``SkillClient``).
- ``approval_prompt``: asking the client about a parked call (``--approve-over-mcp``);
  ``approval_state``: the sealed ``requestState`` of a question asked in an
  ``input_required`` result (MCP 2026-07-28).
- ``http``: the streamable-HTTP endpoint's bearer-token guard and host rules.
- ``serve``: the command's body (catalogue, embedded local worker, transports, signals).
- ``stdio``: stdin lines read on the event loop, so a stopped server stops at once.
- ``importer``: a skill file from a remote MCP server's ``tools/list``.

Importing this package imports the MCP SDK; the CLI imports it only when an MCP
command runs.
"""

from __future__ import annotations

from cleveragents.mcp.call_results import call_result
from cleveragents.mcp.http import TOKEN_ENV, BearerGuard, check_http_options, is_loopback
from cleveragents.mcp.importer import RemoteServer, import_skill, skill_document, tool_access
from cleveragents.mcp.naming import META_SKILL, META_TOOL, ToolRoute, ToolTable
from cleveragents.mcp.serve import ServeOptions, serve
from cleveragents.mcp.server import FleetTools, build_server

__all__ = [
    "META_SKILL",
    "META_TOOL",
    "TOKEN_ENV",
    "BearerGuard",
    "FleetTools",
    "RemoteServer",
    "ServeOptions",
    "ToolRoute",
    "ToolTable",
    "build_server",
    "call_result",
    "check_http_options",
    "import_skill",
    "is_loopback",
    "serve",
    "skill_document",
    "tool_access",
]
