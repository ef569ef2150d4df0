"""The server's own MCP tool ``cleveragents__result``: what became of an invocation, by id.

An agent whose call answered ``awaiting_approval`` (or that lost a call's answer)
learns its outcome here instead of calling the tool again: the stored
``SkillResult`` once there is one, else the invocation's state (awaiting approval,
running, revoked, or unknown: Celery cannot tell a queued invocation from an id it
never saw). The answer is never ``isError`` for a request that failed: the look-up
worked, and frameworks retry error results. Pure mapping: the server reads the stores.
"""

from __future__ import annotations

import json
from typing import Any

from mcp import types

from cleveragents.constants import STATE_AWAITING_APPROVAL
from cleveragents.mcp.call_results import META_REQUEST_ID, RESULT_TOOL
from cleveragents.skills import SkillResult

__all__ = ["RESULT_TOOL", "RESULT_TOOL_DEFINITION", "bad_lookup", "outcome_of"]

#: The ``tools/list`` entry of ``cleveragents__result``.
RESULT_TOOL_DEFINITION: dict[str, Any] = {
    "name": RESULT_TOOL,
    "title": "Outcome of an invocation",
    "description": (
        "What became of an earlier call, by its request_id (the cleveragents/request_id of "
        "its result, or the request_id of an awaiting_approval answer): its result once it "
        "ran, else its state (awaiting_approval, running, revoked, unknown). Use this "
        "instead of calling a tool again."
    ),
    "inputSchema": {
        "type": "object",
        "properties": {
            "request_id": {"type": "string", "minLength": 1, "description": "The request id"}
        },
        "required": ["request_id"],
        "additionalProperties": False,
    },
    "annotations": {
        "readOnlyHint": True,
        "destructiveHint": False,
        "idempotentHint": True,
        "openWorldHint": False,
    },
}
#: What an agent should do next, by state.
_NEXT = {
    "succeeded": "It ran: use its output.",
    "failed": "It ran and failed (error): do not call this tool again for it.",
    "awaiting_approval": (
        "It waits for a person's approval (cleveragents approvals approve {id}). Do not "
        "call the tool again; tell the user, and look again later."
    ),
    "running": "It is running or about to run: look again in a few seconds.",
    "revoked": "It was cancelled and will not run.",
    "unknown": (
        "No result and no record of it yet: it may still be queued, or the id is not one "
        "of this fleet's. Look again in a few seconds; do not call the tool again."
    ),
}
_STATES = {
    STATE_AWAITING_APPROVAL: "awaiting_approval",
    "STARTED": "running",
    "RETRY": "running",
    "RECEIVED": "running",
    "REVOKED": "revoked",
}


def outcome_of(request_id: str, result: SkillResult | None, state: str) -> types.CallToolResult:
    """The answer of ``cleveragents__result``: ``result`` when stored, else ``state``'s meaning."""
    structured: dict[str, Any] = {"request_id": request_id}
    if result is not None:
        name = "succeeded" if result.success else "failed"
        structured["result"] = result.model_dump(mode="json")
    else:
        name = _STATES.get(state, "unknown")
    structured["state"] = name
    structured["retry"] = False
    structured["next_step"] = _NEXT[name].format(id=request_id)
    if result is not None and result.success:
        summary = json.dumps(result.output_data)
    elif result is not None and result.error is not None:
        summary = f"{result.error.error_type}: {result.error.message}"
    else:
        summary = structured["next_step"]
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=f"{name}: {summary}")],
        structured_content=structured,
        meta={META_REQUEST_ID: request_id},
    )


def bad_lookup(arguments: dict[str, Any]) -> types.CallToolResult | None:
    """The error answer to arguments without a usable ``request_id``, or None when usable."""
    request_id = arguments.get("request_id")
    if isinstance(request_id, str) and request_id.strip() and set(arguments) == {"request_id"}:
        return None
    return types.CallToolResult(
        content=[
            types.TextContent(
                type="text",
                text="validation_error: give exactly one argument, request_id (a string)",
            )
        ],
        is_error=True,
    )
