"""The ``mcp`` tool kind: a tool that is a tool of a remote MCP server.

A skill file names the server and the tool (SPEC section 10)::

    source: mcp
    server: {command: [python, -m, my_server], env: {LEVEL: debug}}   # stdio
    server: {url: https://h/mcp, headers_from_env: {Authorization: MY_TOKEN}}  # HTTP
    remote_tool: lookup

The worker calls the remote tool as an MCP client, over a session it keeps per
server and per process (``mcp_sessions``). The runtime applies the same gates,
schemas and time-out as for every kind. This module turns the outcomes into the
library's: ``structuredContent`` (or a JSON text block) is the output; an
``isError`` answer, a JSON-RPC error or a server that dies during the call is a
``ToolExecutionError``; a server that cannot be started or reached is a
``ToolActivationError``; no answer by the deadline is ``ToolTimedOut`` (the
request is cancelled on the server, which is how MCP stops a tool); a server
that sends more than the output limit during a call is ``ToolOutputTooLarge``,
at once (its session is closed). Every text a server wrote into a failure is
kept as a short excerpt, the arguments blanked.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

from mcp import types
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from cleveragents.constants import REDACTED, STDERR_TAIL_CHARS, STDOUT_HEAD_CHARS
from cleveragents.errors import (
    ToolActivationError,
    ToolExecutionError,
    ToolOutputTooLarge,
    ToolTimedOut,
)
from cleveragents.runtime.kinds.command import KIND as COMMAND_KIND
from cleveragents.runtime.kinds.mcp_sessions import (
    AnswerTooLarge,
    CallTimedOut,
    ConnectionLost,
    ServerSpec,
    ServerUnavailable,
    sessions,
)
from cleveragents.runtime.output_limit import max_output_bytes
from cleveragents.runtime.text import blank_arguments
from cleveragents.skills import ToolSpec
from cleveragents.traces.carriers import current_carrier

__all__ = [
    "KIND",
    "McpKind",
    "check_mcp_tool",
    "output_of",
    "run_mcp_tool",
    "runs_a_server",
    "server_of",
]

_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: An HTTP header name (an RFC 9110 token).
_HEADER_RE = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_STDIO_KEYS = frozenset({"command", "env"})
_HTTP_KEYS = frozenset({"url", "headers_from_env"})
#: The longest excerpt of a server's error text kept in a failure.
_EXCERPT_CHARS = STDOUT_HEAD_CHARS * 5


def _names(where: str, value: Any, key_re: re.Pattern[str], what: str) -> None:
    """``value`` is a mapping of names matching ``key_re`` to strings."""
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and key_re.match(k) and isinstance(v, str) for k, v in value.items()
    ):
        raise ValueError(f"{where}: {what}")


def _check_stdio(where: str, server: Mapping[str, Any]) -> None:
    command = server["command"]
    if (
        not isinstance(command, list)
        or not command
        or not all(isinstance(a, str) and a for a in command)
    ):
        raise ValueError(f"{where}: server.command must be a non-empty list of strings")
    _names(where, server.get("env", {}), _ENV_NAME_RE, "server.env maps variable names to strings")


def _check_http(where: str, server: Mapping[str, Any], tool: ToolSpec) -> None:
    url = server["url"]
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ValueError(f"{where}: server.url must be an http:// or https:// URL")
    _names(
        where,
        server.get("headers_from_env", {}),
        _HEADER_RE,
        "server.headers_from_env maps header names to environment variable names",
    )
    if not all(_ENV_NAME_RE.match(v) for v in server.get("headers_from_env", {}).values()):
        raise ValueError(f"{where}: server.headers_from_env values are environment variable names")
    if tool.pass_env:
        raise ValueError(f"{where}: pass_env is for stdio servers (use server.headers_from_env)")
    if tool.sandbox is not None:
        raise ValueError(f"{where}: sandbox is for stdio servers (an HTTP server runs elsewhere)")


def runs_a_server(tool: ToolSpec) -> bool:
    """Whether the mcp tool starts its server (stdio): only such a tool can be sandboxed."""
    server = tool.options.get("server")
    return isinstance(server, Mapping) and "command" in server


def check_mcp_tool(tool: ToolSpec) -> None:
    """An mcp tool needs ``remote_tool`` and a ``server`` with exactly one of command and url.

    Raises:
        ValueError: the spec is not a valid mcp tool.
    """
    where = f"mcp tool {tool.name!r}"
    if tool.entrypoint is not None or tool.command is not None:
        raise ValueError(f"{where} must not set entrypoint or command (see server.command)")
    remote = tool.options.get("remote_tool")
    if not isinstance(remote, str) or not remote:
        raise ValueError(f"{where} needs remote_tool: the name of the server's tool")
    server = tool.options.get("server")
    if not isinstance(server, Mapping):
        raise ValueError(f"{where} needs server: {{command: [...]}} or {{url: ...}}")
    if ("command" in server) == ("url" in server):
        raise ValueError(f"{where}: server needs exactly one of command (stdio) and url (HTTP)")
    allowed = _STDIO_KEYS if "command" in server else _HTTP_KEYS
    unknown = sorted(set(server) - allowed)
    if unknown:
        raise ValueError(f"{where}: server does not take {', '.join(map(str, unknown))}")
    if "command" in server:
        _check_stdio(where, server)
    else:
        _check_http(where, server, tool)


def server_of(tool: ToolSpec) -> ServerSpec:
    """The server a checked mcp tool names (the key its session is shared by)."""
    server = tool.options["server"]
    if "url" in server:
        return ServerSpec(
            url=server["url"],
            headers_from_env=tuple(sorted(server.get("headers_from_env", {}).items())),
        )
    return ServerSpec(
        command=tuple(server["command"]),
        env=tuple(sorted(server.get("env", {}).items())),
        pass_env=tuple(sorted(tool.pass_env)),
        sandbox=COMMAND_KIND.sandboxing.policy(tool),
    )


def _remote_text(result: types.CallToolResult) -> str:
    texts = [block.text for block in result.content if isinstance(block, types.TextContent)]
    return "\n".join(texts) or "(no text)"


def output_of(tool: ToolSpec, result: types.CallToolResult) -> Any:
    """The output data of a tool call's result.

    ``structuredContent`` when there is one; else the text: one block of JSON is
    that value, other text is a string; content that is not all text is its list
    of MCP content blocks.

    Raises:
        ToolExecutionError: the result is an ``isError`` answer (its text in the message).
    """
    remote = tool.options["remote_tool"]
    if result.is_error:
        text = _remote_text(result)
        raise ToolExecutionError(
            f"MCP tool {remote!r} answered with an error: {text}",
            details={"remote_tool": remote, "remote_error": text},
        )
    if result.structured_content is not None:
        return result.structured_content
    if not all(isinstance(block, types.TextContent) for block in result.content):
        return [
            block.model_dump(mode="json", by_alias=True, exclude_none=True)
            for block in result.content
        ]
    if len(result.content) == 1:
        try:
            return json.loads(_remote_text(result))
        except ValueError:
            pass
    return "\n".join(block.text for block in result.content if isinstance(block, types.TextContent))


def _said(text: str, arguments: dict[str, Any], keep: int) -> str:
    """A server's text as shown and stored: the arguments blanked, cut to ``keep`` chars."""
    text = blank_arguments(text, arguments, REDACTED)
    return text if len(text) <= keep else text[:keep] + f"... ({len(text) - keep:,} more chars)"


def _tail(stderr_tail: str, arguments: dict[str, Any]) -> str:
    return blank_arguments(stderr_tail, arguments, REDACTED)[-STDERR_TAIL_CHARS:]


def _missing_header_variables(tool: ToolSpec, server: ServerSpec) -> None:
    missing = [var for _, var in server.headers_from_env if var not in os.environ]
    if missing:
        raise ToolActivationError(
            f"tool activation failed for {tool.name!r}: environment variable(s) "
            f"{', '.join(missing)} of its server's headers_from_env are not set in this worker",
            details={"missing_env": missing},
        )


def run_mcp_tool(tool: ToolSpec, arguments: dict[str, Any], timeout_s: float) -> Any:
    """Call the remote tool with the arguments; its output data.

    Raises:
        ToolActivationError: the server cannot be started or reached, or did not answer.
        ToolTimedOut: no answer within ``timeout_s`` (the request was cancelled).
        ToolOutputTooLarge: the server sent more than the output limit during the call.
        ToolExecutionError: the remote tool failed, or the server went away during the call.
    """
    server = server_of(tool)
    remote = tool.options["remote_tool"]
    _missing_header_variables(tool, server)
    if server.sandbox is not None:  # sandbox_unavailable: never started without one
        COMMAND_KIND.sandboxing.require(tool.name, COMMAND_KIND.user)
    try:
        # The invocation's trace context travels on: a server that traces joins the trace
        meta = current_carrier() or None
        result = sessions().call(server, remote, arguments, timeout_s, max_output_bytes(), meta)
    except _CALL_FAILURES as exc:
        raise _failure(exc, tool, server, arguments, timeout_s) from None
    if result.is_error:
        text = _said(_remote_text(result), arguments, _EXCERPT_CHARS)
        raise ToolExecutionError(
            f"MCP tool {remote!r} answered with an error: {text}",
            details={"remote_tool": remote, "remote_error": text},
        )
    return output_of(tool, result)


#: What a call can fail with, each turned into the library's error by ``_failure``;
#: ``RuntimeError`` and ``ValidationError``: the SDK's checks of the server's answer.
_CALL_FAILURES = (
    CallTimedOut,
    AnswerTooLarge,
    ServerUnavailable,
    ConnectionLost,
    MCPError,
    RuntimeError,
    ValidationError,
)


def _failure(
    exc: Exception, tool: ToolSpec, server: ServerSpec, arguments: dict[str, Any], timeout_s: float
) -> Exception:
    """The library's error for a failed call: its kind, and texts with arguments blanked."""
    remote = tool.options["remote_tool"]
    if isinstance(exc, CallTimedOut):
        return ToolTimedOut(tool.name, timeout_s, details={"remote_tool": remote})
    if isinstance(exc, AnswerTooLarge):
        return ToolOutputTooLarge(tool.name, "output", exc.limit_bytes)
    if isinstance(exc, ServerUnavailable):
        said = _said(str(exc), arguments, _EXCERPT_CHARS)
        details = {"remote_tool": remote, "stderr_tail": _tail(exc.stderr_tail, arguments)}
        if server.url is not None:  # not reached over the network: it may be back soon
            details["transient"] = True
        return ToolActivationError(
            f"tool activation failed for {tool.name!r}: MCP server {server.describe()!r}: {said}",
            details=details,
        )
    if isinstance(exc, ConnectionLost):
        tail = _tail(exc.stderr_tail, arguments)
        return ToolExecutionError(
            f"MCP server {server.describe()!r} went away during the call of {remote!r}",
            details={"remote_tool": remote, "stderr_tail": tail, "transient": True},
        )
    if isinstance(exc, MCPError):
        said = _said(exc.message, arguments, _EXCERPT_CHARS)
        return ToolExecutionError(
            f"MCP server {server.describe()!r} refused the call of {remote!r}: {said}",
            details={"remote_tool": remote, "mcp_error_code": exc.code},
        )
    said = _said(str(exc), arguments, _EXCERPT_CHARS)
    return ToolExecutionError(
        f"MCP tool {remote!r} gave an answer that is not valid: {said}",
        details={"remote_tool": remote, "exception_type": type(exc).__name__},
    )


class McpKind:
    """Tools of remote MCP servers, called over stdio or streamable HTTP (``source: mcp``)."""

    #: The kind's own keys, written beside the common ones in a skill file.
    option_fields = ("server", "remote_tool")
    #: A stdio server may run in a sandbox (``runtime/sandbox.py``), an HTTP one not.
    sandboxable = staticmethod(runs_a_server)

    #: See ``check_mcp_tool``.
    check = staticmethod(check_mcp_tool)
    #: See ``run_mcp_tool``.
    run = staticmethod(run_mcp_tool)


#: The registered ``mcp`` kind.
KIND = McpKind()
