"""``SkillResult`` to MCP ``CallToolResult``, and the results the server answers itself.

- Success: ``structuredContent`` is the tool's ``output_data`` and one text block
  holds the same data as JSON (for clients that read text only). MCP (through
  2025-11-25) wants ``structuredContent`` to be a JSON object, so other data
  (a list, a string, a number) is given as ``{"result": data}``, as the SDK's own
  ``MCPServer`` does; such tools declare no ``outputSchema``.
- Failure: ``isError: true`` and one text block ``"<error_type>: <message>"``, so a
  model reads which kind of failure it was (``validation_error``,
  ``permission_denied``, ...) and can correct its call.
- Either way ``_meta`` carries ``cleveragents/request_id`` (the invocation's id,
  for ``cleveragents result ID``), and on failure ``cleveragents/error`` (the
  ``SkillError`` as JSON) or on success ``cleveragents/resource_changes``.
- Awaiting approval, when the client is not asked to decide (``awaiting_result``):
  ``isError: true`` (nothing ran, and a success would have to match the tool's
  ``outputSchema``, which clients check), a text block saying how a person holding
  the approver role approves it and that the agent must not call again, and
  ``structuredContent`` ``{"state": "awaiting_approval", ..., "retry": false,
  "next_step": ...}`` saying the same (frameworks that turn an error result into a
  retry feed the model the structured content, not the text).
- Refused (``permission_denied``): ``structuredContent`` ``{"state": "refused",
  "error_type", "message", "retry": false, "next_step"}`` as well.
"""

from __future__ import annotations

import json
from typing import Any

from mcp import types

from cleveragents.errors import SkillErrorType
from cleveragents.mcp.naming import ToolRoute
from cleveragents.runtime.outcomes import failed_result
from cleveragents.runtime.text import json_text
from cleveragents.skills import SkillResult
from cleveragents.skills.mcp_tools import META_PREFIX

__all__ = [
    "AWAITING",
    "META_ERROR",
    "META_REQUEST_ID",
    "REFUSED",
    "RESULT_TOOL",
    "awaiting_result",
    "call_result",
    "revoked_result",
    "writes_refused",
]

#: ``_meta`` key of a call result: the invocation's request id.
META_REQUEST_ID = f"{META_PREFIX}request_id"
#: ``_meta`` key of a failed call result: the ``SkillError`` as JSON.
META_ERROR = f"{META_PREFIX}error"
_META_CHANGES = f"{META_PREFIX}resource_changes"
#: ``structuredContent.state`` of a call answered while its invocation awaits approval.
AWAITING = "awaiting_approval"
#: ``structuredContent.state`` of a refused call (``permission_denied``).
REFUSED = "refused"
#: The server's own tool: a request's outcome by id (``cleveragents.mcp.result_tool``).
RESULT_TOOL = "cleveragents__result"


def _text(value: Any) -> types.TextContent:
    text = value if isinstance(value, str) else json.dumps(value)
    return types.TextContent(type="text", text=text)


def call_result(result: SkillResult, request_id: str | None) -> types.CallToolResult:
    """The MCP answer to a ``tools/call`` that ended with ``result``."""
    meta: dict[str, Any] = {META_REQUEST_ID: request_id} if request_id else {}
    if not result.success:
        error = result.error
        kind = str(error.error_type) if error else str(SkillErrorType.TOOL_EXECUTION_FAILURE)
        message = error.message if error else "the invocation failed"
        if error is not None:
            meta[META_ERROR] = error.model_dump(mode="json")
        return types.CallToolResult(
            content=[_text(f"{kind}: {message}")],
            structured_content=_refused(kind, message, request_id),
            is_error=True,
            meta=meta or None,
        )
    data = result.output_data
    structured = data if isinstance(data, dict) else {"result": data}
    if result.resource_changes:
        meta[_META_CHANGES] = result.resource_changes
    # A text output is the text itself: an agent reads "hello", not "\"hello\"" (its
    # structured content keeps the JSON value); any other value is its JSON.
    return types.CallToolResult(
        content=[_text(data if isinstance(data, str) else json_text(data))],
        structured_content=structured,
        meta=meta or None,
    )


def _refused(kind: str, message: str, request_id: str | None) -> dict[str, Any] | None:
    """The structured content of a refused call (``permission_denied``): do not retry.

    Other failures have none: a model may correct its arguments and call again.
    """
    if kind != SkillErrorType.PERMISSION_DENIED:
        return None
    return {
        "state": REFUSED,
        "request_id": request_id,
        "error_type": kind,
        "message": message,
        "retry": False,
        "next_step": "Do not retry: the same call is refused again. Tell the user why "
        "(message) and stop, or do something else.",
    }


def writes_refused(route: ToolRoute) -> SkillResult:
    """The ``permission_denied`` result of a write-capable tool on a server without writes."""
    return failed_result(
        route.skill,
        route.tool,
        SkillErrorType.PERMISSION_DENIED,
        f"tool {route.tool} of skill {route.skill} is write-capable and this MCP server "
        "was started without --allow-writes; nothing was run",
        {"gate": "mcp_server_disallows_writes", "gates": ["mcp_server_disallows_writes"]},
    )


def revoked_result(route: ToolRoute, request_id: str) -> SkillResult:
    """The result of an invocation revoked before it ended (it has no result of its own)."""
    return failed_result(
        route.skill,
        route.tool,
        SkillErrorType.TOOL_EXECUTION_FAILURE,
        f"invocation {request_id} was revoked before it ended",
        {"reason": "revoked"},
    )


def awaiting_result(route: ToolRoute, request_id: str, why: str) -> types.CallToolResult:
    """The answer to a call whose invocation stays parked: how a person approves it.

    Said to the agent, which cannot approve it: a person holding the approver role does.
    ``why`` says why the client was not asked. The structured content says the same as
    the text, since some frameworks feed the model only that: ``retry: false`` and a
    ``next_step`` (look the outcome up with ``cleveragents__result``).
    """
    approve = f"cleveragents approvals approve {request_id}"
    reject = f"cleveragents approvals reject {request_id} --reason TEXT"
    result = f"cleveragents result {request_id}"
    next_step = (
        f"Do not retry: tell the user that invocation {request_id} waits for a person's "
        f"approval ({approve}), then stop. Call the tool {RESULT_TOOL} with this request_id "
        "to learn what became of it; an identical call from this session joins it."
    )
    text = (
        f"{AWAITING}: tool {route.tool} of skill {route.skill} waits for a person's approval "
        f"and has not run (invocation {request_id}); the client was not asked: {why}. Only a "
        f"person holding the approver role can approve it, with `{approve}` (or reject it "
        f"with `{reject}`); `{result}` or the tool {RESULT_TOOL} then shows its result. Tell "
        "the user so and stop here: do not call this tool again for this request."
    )
    structured = {
        "state": AWAITING,
        "request_id": request_id,
        "skill": route.skill,
        "tool": route.tool,
        "approve": approve,
        "reject": reject,
        "result": result,
        "approved_by": "a person holding the approver role",
        "not_asked_because": why,
        "retry": False,
        "call_again": False,
        "next_step": next_step,
    }
    return types.CallToolResult(
        content=[_text(text)],
        structured_content=structured,
        is_error=True,
        meta={META_REQUEST_ID: request_id},
    )
