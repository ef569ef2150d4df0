"""Tool kinds: the registry and dispatch (``registry``), and one module per built-in kind.

``python`` (a function from the catalogue), ``command`` (a program under its
shepherd) and ``mcp`` (a remote MCP server's tool, its sessions in ``mcp_sessions``).
"""

from __future__ import annotations

from cleveragents.runtime.kinds.registry import (
    ToolKind,
    load_tool_kinds,
    register_tool_kind,
    run_tool,
)

__all__ = ["ToolKind", "load_tool_kinds", "register_tool_kind", "run_tool"]
