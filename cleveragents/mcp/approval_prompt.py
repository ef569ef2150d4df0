"""Asking the MCP client whether a parked invocation may run (``--approve-over-mcp`` only).

An elicitation answer is the client program's word, not a person's: any program
that talks to the server can answer its own question, so ``mcp serve`` asks only
when its operator opted in with ``--approve-over-mcp``. Then, when a call's
invocation is parked for approval and the client declared the elicitation
capability (form mode), it is asked one form question naming the skill, the tool
and the arguments; accept approves the digest of exactly those arguments, decline
or cancel rejects, recorded as ``by: mcp-client:<client name>`` (docs/mcp.md,
"Approvals over MCP"). How it is asked depends on the client's protocol revision:

- up to 2025-11-25, ``Approver.ask`` sends an ``elicitation/create`` request during
  the call and waits for the answer;
- from 2026-07-28, where a server may not send a request during a call, the call
  answers ``input_required`` (``question_result``): the same question, and a sealed
  ``requestState`` (``approval_state``); the client calls again with the answer
  (``answer_of``) and the state, and ``Approver.decide`` records it.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import anyio
from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.server.session import ServerSession
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from cleveragents.approvals import ApprovalError
from cleveragents.client import SkillClient
from cleveragents.mcp.call_results import META_REQUEST_ID
from cleveragents.mcp.naming import ToolRoute
from cleveragents.pipeline.binding import request_digest
from cleveragents.runtime.request import SkillInvocationRequest

__all__ = [
    "BY_PREFIX",
    "INPUT_KEY",
    "Approver",
    "answer_of",
    "asks_in_result",
    "can_elicit",
    "client_name",
    "decided_by",
    "question",
    "question_result",
    "why_not_asked",
]

log = logging.getLogger("cleveragents.mcp")

#: The audit ``by`` of a decision taken over MCP: the client program's name after it.
BY_PREFIX = "mcp-client:"
#: The form of the question: one optional field, the person's reason.
REASON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "reason": {
            "type": "string",
            "title": "Reason",
            "description": "Why (optional): kept with the decision; on a rejection the agent "
            "reads it",
        }
    },
}
#: The key of the approval question in an ``input_required`` result's ``inputRequests``.
INPUT_KEY = "approval"
#: The longest JSON of the arguments a question shows (``approvals show`` shows them all).
MAX_ARGUMENTS_CHARS = 4000
#: The reason of a rejection the person gave none for.
_NO_REASON = {"decline": "declined over MCP", "cancel": "cancelled over MCP"}


def why_not_asked(session: ServerSession, *, approve_over_mcp: bool) -> str | None:
    """Why the client of ``session`` is not asked about a parked call, or None when it is.

    The capability is read however the client's protocol revision declares it: in
    ``initialize`` (up to 2025-11-25), or in each request's ``_meta`` clientCapabilities
    (2026-07-28); the SDK records either as the session's ``client_capabilities``. A
    2026-07-28 client is asked in the call's result (``input_required``), which needs no
    channel back to it.
    """
    if not approve_over_mcp:
        return (
            "this server does not ask MCP clients (it was started without --approve-over-mcp: "
            "an elicitation answer is a program's word, not a person's)"
        )
    capabilities = session.client_capabilities
    elicitation = capabilities.elicitation if capabilities is not None else None
    if elicitation is None:
        return "the client did not declare the elicitation capability"
    # An empty capability (MCP 2025-06-18) means form mode; a URL-only client has no form.
    if elicitation.form is None and elicitation.url is not None:
        return "the client declared URL-mode elicitation only, and the question is a form"
    if asks_in_result(session):
        return None
    if not session.can_send_request:
        return "the transport has no channel back to the client"
    return None


def asks_in_result(session: ServerSession) -> bool:
    """Whether the question goes in the call's ``input_required`` result (MCP 2026-07-28).

    Otherwise it is an ``elicitation/create`` request sent during the call.
    """
    return session.protocol_version in MODERN_PROTOCOL_VERSIONS


def can_elicit(session: ServerSession) -> bool:
    """Whether the person can be asked a form question through this session's client."""
    return why_not_asked(session, approve_over_mcp=True) is None


def client_name(session: ServerSession) -> str:
    """The client's name from ``initialize`` (``clientInfo.name``), or ``client``."""
    params = session.client_params
    info = params.client_info if params is not None else None
    return (info.name.strip() if info is not None else "") or "client"


def decided_by(session: ServerSession) -> str:
    """The audit ``by`` of an answer from this session: ``mcp-client:<client name>``.

    The name is whatever the client program chose to call itself: the prefix says so.
    """
    return f"{BY_PREFIX}{client_name(session)}"


def question(route: ToolRoute, request: SkillInvocationRequest) -> str:
    """What the person is asked: the skill, the tool, the invocation and its arguments."""
    arguments = json.dumps(request.arguments, indent=2, sort_keys=True, default=str)
    if len(arguments) > MAX_ARGUMENTS_CHARS:
        arguments = (
            f"{arguments[:MAX_ARGUMENTS_CHARS]}\n... (cut: `cleveragents approvals show "
            f"{request.request_id}` shows them all)"
        )
    return (
        f"Approve this call? Tool {route.tool} of skill {route.skill} (invocation "
        f"{request.request_id}) waits for a person's approval before it runs, with these "
        f"arguments:\n{arguments}\nAccept runs it once; decline rejects it (a reason you give "
        "is passed to the agent)."
    )


def question_result(
    route: ToolRoute, request: SkillInvocationRequest, state: str
) -> types.InputRequiredResult:
    """The ``input_required`` answer of a parked call: the question, and the sealed ``state``.

    ``_meta`` names the invocation (``cleveragents/request_id``), as every answer of a call does.
    """
    ask = types.ElicitRequest(
        params=types.ElicitRequestFormParams(
            message=question(route, request), requested_schema=REASON_SCHEMA
        )
    )
    return types.InputRequiredResult(
        input_requests={INPUT_KEY: ask},
        request_state=state,
        _meta={META_REQUEST_ID: request.request_id},
    )


def answer_of(responses: dict[str, Any] | None) -> types.ElicitResult | None:
    """The client's answer to the approval question in a call's ``inputResponses``, if any."""
    answer = (responses or {}).get(INPUT_KEY)
    if isinstance(answer, types.ElicitResult):
        return answer
    if isinstance(answer, dict):  # the SDK's union may keep an answer it could not place
        try:
            return types.ElicitResult.model_validate(answer)
        except ValueError:
            return None
    return None


class Approver:
    """Asks the client about one parked invocation, and records its answer as the decision.

    Built only when the operator opted in (``--approve-over-mcp``). ``ask`` asks during
    the call (up to MCP 2025-11-25); ``decide`` records an answer however it came (from
    2026-07-28, with the call sent again after an ``input_required`` result).

    ``failed`` turns true when the question could not be asked or the answer not
    recorded (the call then answers with ``awaiting_result``). A decision taken
    elsewhere first (``ApprovalError``) is not a failure: the call waits for its result.
    """

    def __init__(
        self,
        ctx: ServerRequestContext[Any, Any],
        client: SkillClient,
        route: ToolRoute,
        request: SkillInvocationRequest,
    ) -> None:
        self.ctx = ctx
        self.client = client
        self.route = route
        self.request = request
        self.failed = False

    async def ask(self) -> None:
        """Ask once, then approve or reject as the client answered."""
        request_id = self.request.request_id
        log.info(
            "call %s: invocation %s awaits approval; asking the client", self.route.name, request_id
        )
        try:
            answer = await self.ctx.session.elicit_form(
                question(self.route, self.request),
                REASON_SCHEMA,
                related_request_id=self.ctx.request_id,
            )
        except Exception as exc:  # an error answer, no back-channel, a malformed answer
            log.warning(
                "invocation %s: could not ask the client (%s); it stays parked", request_id, exc
            )
            self.failed = True
            return
        await self.decide(answer)

    async def decide(self, answer: types.ElicitResult) -> None:
        """Approve (accept) or reject (decline, cancel) as the client answered."""
        request_id = self.request.request_id
        by = decided_by(self.ctx.session)
        said = answer.content.get("reason") if answer.content else None
        reason = said.strip() if isinstance(said, str) and said.strip() else None
        try:
            if answer.action == "accept":
                # The approval names what the question showed: a parked call changed since
                # then is not approved by this answer.
                digest = request_digest(self.request)
                await anyio.to_thread.run_sync(
                    lambda: self.client.approvals.approve(
                        request_id, digest=digest, by=by, reason=reason, channel="mcp"
                    )
                )
            else:
                why = reason or _NO_REASON[answer.action]
                await anyio.to_thread.run_sync(
                    lambda: self.client.approvals.reject(
                        request_id, reason=why, by=by, channel="mcp"
                    )
                )
        except ApprovalError as exc:  # decided elsewhere first, or expired: the result tells
            log.info(
                "invocation %s: the client's answer (%s) was not recorded: %s",
                request_id,
                answer.action,
                exc,
            )
            return
        except Exception as exc:  # the store or the broker refused (an ACL, an outage)
            log.warning(
                "invocation %s: could not record the client's answer (%s): %s",
                request_id,
                answer.action,
                exc,
            )
            self.failed = True
            return
        log.info(
            "invocation %s: %s by %s",
            request_id,
            "approved" if answer.action == "accept" else "rejected",
            by,
        )
