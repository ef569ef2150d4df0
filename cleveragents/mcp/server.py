"""The MCP server over the catalogue: ``tools/list`` is the catalogue, ``tools/call`` the queue.

Built on the SDK's low-level ``Server`` (``mcp.server.lowlevel``) rather than
``MCPServer``: ``MCPServer`` derives each tool's schema from a Python function
and validates arguments itself, while here the tools are the catalogue's (their
schemas come from skill files) and the worker does the validating, so that a
call through MCP meets exactly the gates and checks of any other invocation.

A call is one invocation sent with ``SkillClient`` (Flower, metrics and the
guarantees apply), then waited for by polling the result store from worker
threads, so the event loop stays free: progress is reported once a second while
the client asked for it, and ``notifications/cancelled`` (which cancels the
handler) revokes the invocation: a queued one never starts, a running read is
terminated, a running write is left to finish (and the log says so). A call
whose invocation is parked for a person's approval answers at once with how a
person approves it (``awaiting_result``) and the invocation stays parked: an
elicitation answer is the client program's word, not a person's, so the client
is asked (``Approver``: accept approves, decline or cancel rejects, ``by:
mcp-client:<client name>``) only when the operator opted in with
``--approve-over-mcp`` and the client declared elicitation: during the call (up to
MCP 2025-11-25), or, from 2026-07-28, in the call's ``input_required`` result with
a sealed ``requestState`` (``StateSeal``), the answer coming with the call sent
again. When the question cannot be asked or the answer not recorded here, the call
answers the same way (and says why the client was not asked). Agent frameworks
retry error results: an identical call from the same session while its invocation
is parked joins it (same request id) instead of parking another, and
``cleveragents__result`` (listed after the catalogue) tells what became of a request.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, cast

import anyio
from anyio.abc import TaskGroup
from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp.types.jsonrpc import INVALID_PARAMS

from cleveragents import __version__
from cleveragents.client import SkillClient
from cleveragents.constants import STATE_AWAITING_APPROVAL
from cleveragents.errors import SchemaValidationError, SkillErrorType
from cleveragents.mcp.approval_prompt import (
    Approver,
    answer_of,
    asks_in_result,
    question_result,
    why_not_asked,
)
from cleveragents.mcp.approval_state import StateRefused, StateSeal
from cleveragents.mcp.call_results import (
    AWAITING,
    RESULT_TOOL,
    awaiting_result,
    call_result,
    revoked_result,
    writes_refused,
)
from cleveragents.mcp.naming import ToolRoute, ToolTable
from cleveragents.mcp.result_tool import RESULT_TOOL_DEFINITION, bad_lookup, outcome_of
from cleveragents.pipeline.binding import request_digest
from cleveragents.runtime.outcomes import failed_result
from cleveragents.runtime.request import SkillInvocationRequest
from cleveragents.skills import SkillResult
from cleveragents.traces.carriers import carrier_of

__all__ = ["PROGRESS_INTERVAL_S", "SERVER_NAME", "FleetTools", "build_server"]

log = logging.getLogger("cleveragents.mcp")

#: The server's name in ``initialize`` (``serverInfo.name``).
SERVER_NAME = "cleveragents"
#: How often a waiting call reports progress and reads its invocation's state.
PROGRESS_INTERVAL_S = 1.0
#: First and longest pause between two reads of the result store while a call waits.
FIRST_POLL_S = 0.02
MAX_POLL_S = 0.25
#: Celery states that mean the invocation is over.
_ENDED = frozenset({"SUCCESS", "FAILURE", "REVOKED"})
#: The streamable HTTP header naming the session a request belongs to.
SESSION_HEADER = "mcp-session-id"
_INSTRUCTIONS = (
    "Each tool is one tool of one skill of the CleverAgents catalogue; calls run as "
    "invocations on Celery workers. _meta cleveragents/skill and cleveragents/tool name them."
)


def _describe(state: str) -> str:
    if state == "STARTED":
        return "running"
    if state in ("PENDING", "RECEIVED"):
        return "queued"
    if state == STATE_AWAITING_APPROVAL:
        return "awaiting approval"
    return state.lower()


#: What a call's wait ends with: the invocation's result, or an answer of the server's own.
_Outcome = SkillResult | types.CallToolResult | types.InputRequiredResult


@dataclass
class _Call:
    """One call being waited for: what ``_poll`` and ``_ask`` need of it."""

    ctx: ServerRequestContext[Any, Any]
    route: ToolRoute
    request: SkillInvocationRequest
    #: Where a question sent during the call runs, withdrawn when the call ends.
    asking: TaskGroup
    #: Set once the client is asked (or was, when its answer came with this call).
    approver: Approver | None = None


def _parked(answer: types.CallToolResult | types.InputRequiredResult) -> bool:
    """Whether the call answered while its invocation stays parked (asked, or told so)."""
    if isinstance(answer, types.InputRequiredResult):
        return True
    return (answer.structured_content or {}).get("state") == AWAITING


class FleetTools:
    """The ``tools/list`` and ``tools/call`` handlers: the catalogue, run through the queue."""

    def __init__(
        self,
        table: ToolTable,
        client: SkillClient,
        *,
        allow_writes: bool = False,
        approve_over_mcp: bool = False,
        progress_interval_s: float = PROGRESS_INTERVAL_S,
        seal: StateSeal | None = None,
    ) -> None:
        self.table = table
        self.client = client
        self.allow_writes = allow_writes
        #: Whether a client's elicitation answer may decide a parked call (the operator's opt-in).
        self.approve_over_mcp = approve_over_mcp
        self.progress_interval_s = progress_interval_s
        #: Seals the requestState of questions asked in input_required results (a secret
        #: of this process: a state from before a restart, or from another server, is refused).
        self.seal = seal if seal is not None else StateSeal()
        served = [tool for tool in table.tools if tool["name"] != RESULT_TOOL]
        if len(served) < len(table.tools):
            log.warning("a catalogue tool named %s is not served: the name is the server's own",
                        RESULT_TOOL)
        self._listing = types.ListToolsResult(
            tools=[types.Tool.model_validate(tool) for tool in [*served, RESULT_TOOL_DEFINITION]]
        )
        #: Parked calls by (session, content digest): an identical call joins the parked one.
        self._parked: dict[tuple[str, str], str] = {}

    async def list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        """The whole catalogue in one page."""
        return self._listing

    async def call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        """Run one call as an invocation on the fleet and answer with its result."""
        if params.name == RESULT_TOOL:
            return await self._lookup(params.arguments or {})
        route = self.table.route(params.name)
        if route is None:
            raise MCPError(INVALID_PARAMS, f"unknown tool: {params.name}")
        if route.write_capable and not self.allow_writes:
            log.warning("refused %s: write-capable and no --allow-writes", route.name)
            return call_result(writes_refused(route), None)
        try:
            request = self.client.build_request(
                route.skill,
                route.tool,
                params.arguments or {},
                allow_writes=route.write_capable,
            )
        except SchemaValidationError as exc:
            kind = SkillErrorType.VALIDATION_ERROR
            return call_result(failed_result(route.skill, route.tool, kind, str(exc)), None)
        if params.request_state is not None:
            return await self._answered(ctx, route, request, params)
        # The trace the call's _meta names (traceparent, tracestate): the invocation joins it
        trace = carrier_of(params.meta or {})
        parked_key = self._parked_key(ctx, request)
        joined = await self._joinable(parked_key)
        if joined is not None:
            log.info("call %s: joins invocation %s, parked for the same call of this session",
                     route.name, joined)
            request = request.model_copy(update={"request_id": joined})
        outcome = await self._run(ctx, route, request, trace, send=joined is None)
        if isinstance(outcome, SkillResult):
            return call_result(outcome, request.request_id)
        if parked_key is not None and _parked(outcome):
            self._parked[parked_key] = request.request_id
        return outcome

    async def _answered(
        self,
        ctx: ServerRequestContext[Any, Any],
        route: ToolRoute,
        request: SkillInvocationRequest,
        params: types.CallToolRequestParams,
    ) -> types.CallToolResult:
        """A call sent again with the answer to its approval question (MCP 2026-07-28).

        The state must be one this server sealed for this very call (tool and arguments):
        otherwise nothing is decided and the call is refused.
        """
        try:
            state = self.seal.open(
                params.request_state or "", digest=request_digest(request), tool=route.name
            )
        except StateRefused as exc:
            log.warning("call %s: request state refused (%s); nothing was decided",
                        route.name, exc)
            raise MCPError(
                INVALID_PARAMS,
                "invalid or expired requestState: nothing was decided; call the tool again "
                "without it",
            ) from None
        request = request.model_copy(update={"request_id": state.request_id})
        answer = answer_of(params.input_responses)
        if answer is None:
            raise MCPError(INVALID_PARAMS, "requestState came without an answer to the "
                           "approval question (inputResponses.approval): nothing was decided")
        approver = Approver(ctx, self.client, route, request)
        await approver.decide(answer)
        if approver.failed:
            return awaiting_result(route, request.request_id, "the client's answer could not "
                                   "be recorded (the log says why)")
        outcome = await self._run(ctx, route, request, send=False, approver=approver)
        if isinstance(outcome, SkillResult):
            return call_result(outcome, request.request_id)
        return cast(types.CallToolResult, outcome)  # asked already: never input_required

    async def _lookup(self, arguments: dict[str, Any]) -> types.CallToolResult:
        """``cleveragents__result``: the outcome of the invocation ``request_id`` names."""
        refused = bad_lookup(arguments)
        if refused is not None:
            return refused
        request_id = str(arguments["request_id"]).strip()
        found = await anyio.to_thread.run_sync(self.client.get, request_id)
        state = "SUCCESS" if found is not None else await anyio.to_thread.run_sync(
            self.client.state, request_id
        )
        return outcome_of(request_id, found, state)

    @staticmethod
    def _parked_key(
        ctx: ServerRequestContext[Any, Any], request: SkillInvocationRequest
    ) -> tuple[str, str] | None:
        """Which session sent ``request``, and what it asks: None when the session is unknown.

        stdio serves one session; over HTTP the transport's session id names it (a
        2026-07-28 request without one names no session, and so joins nothing).
        """
        http = ctx.request
        if http is None:
            session = "stdio"
        else:
            headers = getattr(http, "headers", None)
            found = headers.get(SESSION_HEADER) if headers is not None else None
            if not found:
                return None
            session = f"http:{found}"
        return session, request_digest(request)

    async def _joinable(self, key: tuple[str, str] | None) -> str | None:
        """The id of the session's parked invocation of the same call, while it is not over."""
        request_id = self._parked.get(key) if key is not None else None
        if request_id is None or key is None:
            return None
        state = await anyio.to_thread.run_sync(self.client.state, request_id)
        if state in _ENDED:
            del self._parked[key]
            return None
        return request_id

    async def _run(
        self,
        ctx: ServerRequestContext[Any, Any],
        route: ToolRoute,
        request: SkillInvocationRequest,
        trace: dict[str, str] | None = None,
        *,
        send: bool = True,
        approver: Approver | None = None,
    ) -> _Outcome:
        try:
            if send:
                await anyio.to_thread.run_sync(
                    lambda: self.client.send(request, skip_if_done=False, trace=trace)
                )
                log.info("call %s: invocation %s sent", route.name, request.request_id)
            return await self._wait(ctx, route, request, approver)
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self.cancel, route, request.request_id)
            raise

    async def _wait(
        self,
        ctx: ServerRequestContext[Any, Any],
        route: ToolRoute,
        request: SkillInvocationRequest,
        approver: Approver | None,
    ) -> _Outcome:
        """The invocation's result; the person is asked meanwhile if it awaits approval.

        ``approver``: the client was asked already (its answer came with this call).
        A question still open when the call ends (decided elsewhere, expired) is withdrawn.
        """
        outcome: _Outcome | Exception
        async with anyio.create_task_group() as asking:
            try:
                outcome = await self._poll(_Call(ctx, route, request, asking, approver))
            except Exception as exc:  # raised as it is below, not inside an exception group
                outcome = exc
            asking.cancel_scope.cancel()
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def _poll(self, call: _Call) -> _Outcome:
        request_id = call.request.request_id
        started = time.monotonic()
        next_report = started + self.progress_interval_s
        pause = FIRST_POLL_S
        while True:
            found = await anyio.to_thread.run_sync(
                self.client.get, request_id, abandon_on_cancel=True
            )
            if found is not None:
                return found
            if call.approver is not None and call.approver.failed:
                return awaiting_result(call.route, request_id, "the question could not be "
                                       "asked or its answer not recorded (the log says why)")
            if time.monotonic() >= next_report:
                state = await anyio.to_thread.run_sync(
                    self.client.state, request_id, abandon_on_cancel=True
                )
                if state == "REVOKED":
                    return revoked_result(call.route, request_id)
                if state == STATE_AWAITING_APPROVAL and call.approver is None:
                    answer = self._ask(call)
                    if answer is not None:
                        return answer
                # A no-op unless the client sent a progressToken with its call.
                await call.ctx.session.report_progress(
                    round(time.monotonic() - started, 3), None, _describe(state)
                )
                next_report = time.monotonic() + self.progress_interval_s
            await anyio.sleep(pause)
            pause = min(pause * 1.5, MAX_POLL_S)

    def _ask(self, call: _Call) -> types.CallToolResult | types.InputRequiredResult | None:
        """Ask the client about the call's parked invocation, or answer why it is not asked.

        None: the question was sent during the call (``call.approver`` asks it), and the
        call waits on. Otherwise the call answers now: with the question (``input_required``,
        MCP 2026-07-28), or with how a person approves it.
        """
        route, request, session = call.route, call.request, call.ctx.session
        why = why_not_asked(session, approve_over_mcp=self.approve_over_mcp)
        if why is not None:
            log.info("call %s: invocation %s awaits a person's approval; the client is not "
                     "asked: %s", route.name, request.request_id, why)
            return awaiting_result(route, request.request_id, why)
        if asks_in_result(session):
            log.info("call %s: invocation %s awaits approval; asking the client in an "
                     "input_required result", route.name, request.request_id)
            state = self.seal.seal(
                request_id=request.request_id, digest=request_digest(request), tool=route.name
            )
            return question_result(route, request, state)
        call.approver = Approver(call.ctx, self.client, route, request)
        call.asking.start_soon(call.approver.ask)
        return None

    def cancel(self, route: ToolRoute, request_id: str) -> None:
        """Revoke a cancelled call's invocation: stop a read, never a running write."""
        state = self.client.state(request_id)
        if state in _ENDED:
            log.info("cancelled %s (%s) after it ended (%s)", request_id, route.name, state)
            return
        if not self.client.revoke(request_id, terminate=not route.write_capable):
            log.warning(
                "cancelled %s (%s): its store cannot revoke it; it runs to its end "
                "and its result is kept (`cleveragents result %s`)",
                request_id, route.name, request_id,
            )
        elif route.write_capable and state == "STARTED":
            log.warning(
                "cancelled %s (%s): a running write is not stopped; it is left to finish "
                "(`cleveragents result %s`)",
                request_id, route.name, request_id,
            )
        else:
            log.info("cancelled %s (%s): revoked (it was %s)", request_id, route.name,
                     _describe(state))


def build_server(tools: FleetTools) -> Server[Any]:
    """The SDK server answering ``tools/list`` and ``tools/call`` with ``tools``."""
    return Server(
        SERVER_NAME,
        version=__version__,
        instructions=_INSTRUCTIONS,
        on_list_tools=tools.list_tools,
        on_call_tool=tools.call_tool,
    )
