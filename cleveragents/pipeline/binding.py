"""A request id is bound to its content, the way an idempotency key is in a payment API.

Its binding is also where a worker finds it cancelled (``cancelled_result``).

The first message (or producer) to use a request id binds it to a digest of what
it asks for: skill, tool and arguments. The same id with the same content is the
same request: its stored result answers it, and it never runs twice for nothing.
The same id with other content runs nothing and stores nothing: it is answered
with a ``validation_error`` whose ``details["reason"]`` is ``request_id_reused``,
and the result stored under the id stays the first request's.

``allow_writes`` is not part of the digest: the documented re-run of a batch line
that only the request's own write gate refused, now with ``--allow-writes``, is
the same request.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from cleveragents.errors import SkillErrorType
from cleveragents.runtime.outcomes import failed_result, names_of
from cleveragents.runtime.request import SkillInvocationRequest
from cleveragents.skills import SkillResult

__all__ = [
    "REASON_CANCELLED",
    "REASON_REUSED",
    "RequestIdReused",
    "cancelled_result",
    "content_digest",
    "request_digest",
    "reused_result",
]

#: ``details["reason"]`` of a request refused because its id was bound to other content.
REASON_REUSED = "request_id_reused"
#: ``details["reason"]`` of a request cancelled before it started (``SkillClient.revoke``).
REASON_CANCELLED = "cancelled"


class RequestIdReused(Exception):
    """Raised instead of sending a request whose id is bound to another request."""

    def __init__(self, result: SkillResult) -> None:
        super().__init__(result.error.message if result.error is not None else REASON_REUSED)
        #: The answer to give: a ``validation_error``, reason ``request_id_reused``.
        self.result = result


def content_digest(body: Any) -> str:
    """The digest of what a request body asks for: its skill, tool and arguments."""
    if isinstance(body, dict):
        asked: Any = {k: body.get(k) for k in ("skill", "tool", "arguments")}
    else:
        asked = body
    try:
        text = json.dumps(asked, sort_keys=True, separators=(",", ":"), default=repr)
    except RecursionError:  # nested far past MAX_NESTING_DEPTH: refused as that, whatever it asks
        text = "nested too deeply"
    return hashlib.sha256(text.encode()).hexdigest()


def request_digest(request: SkillInvocationRequest) -> str:
    """``content_digest`` of a request's wire body, computed from the request itself."""
    return content_digest(
        {"skill": request.skill, "tool": request.tool, "arguments": request.arguments}
    )


def reused_result(body: Any) -> SkillResult:
    """The answer to a request whose id is already bound to other content."""
    skill, tool = names_of(body)
    return failed_result(
        skill,
        tool,
        SkillErrorType.VALIDATION_ERROR,
        "this request id was already used for a different request (other skill, tool or "
        "arguments): nothing was run; send it with a new request id",
        {"reason": REASON_REUSED},
    )


def cancelled_result(body: Any, request_id: str) -> SkillResult:
    """The answer to a request cancelled before any run of it started: nothing ran."""
    skill, tool = names_of(body)
    return failed_result(
        skill,
        tool,
        SkillErrorType.TOOL_EXECUTION_FAILURE,
        f"invocation {request_id} was cancelled before it started: nothing was run",
        {"reason": REASON_CANCELLED},
    )
