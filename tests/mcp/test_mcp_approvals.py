"""Approvals over MCP: only the operator's `--approve-over-mcp` lets a client's answer decide.

The SDK's own client calls a write that needs approval (`test/send-payment` of
the fixture skill `test/approvals`) through `cleveragents mcp serve
--allow-writes` over stdio, on a real worker on Redis. Without
`--approve-over-mcp` no client is asked: one that would accept anything, named
after a person, gets its call parked and is told how a person approves it
(issue 42, attack 4). With the flag, a client that declared elicitation is asked
(skill, tool, arguments): accept approves and the write runs, decline rejects
it, both recorded as `by: mcp-client:<client name>`. A client without
elicitation is told at once how to approve, and the invocation stays parked.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client, types
from mcp.client.session import ClientRequestContext, ElicitationFnT

from cleveragents.client import SkillClient
from cleveragents.constants import STATE_AWAITING_APPROVAL
from cleveragents.mcp.naming import ToolTable
from cleveragents.skills import Catalogue
from tests.support.mcp_support import CLEVERAGENTS, serve_env, text_of, wait_for
from tests.support.procs import EXAMPLE_SKILLS, FIXTURE_SKILLS, REPO, Worker
from tests.support.worker_runs import run_keys

pytestmark = pytest.mark.timeout(240)

SKILL, PAY = "test/approvals", "test/send-payment"
CATALOGUE = os.pathsep.join([str(FIXTURE_SKILLS), str(EXAMPLE_SKILLS)])
#: The name the clients of these tests give in `initialize` (`clientInfo.name`).
CLIENT_NAME = "approver-app"


def _tool_name() -> str:
    """The MCP name of `test/send-payment`, as the server lists it."""
    table = ToolTable.from_catalogue(Catalogue.from_paths(FIXTURE_SKILLS, EXAMPLE_SKILLS))
    (name,) = [r.name for r in table.routes.values() if (r.skill, r.tool) == (SKILL, PAY)]
    return name


@pytest.fixture
def fleet(redis_url: str, start_worker: Callable[..., Worker]) -> str:
    """A worker with the fixture catalogue on the test Redis: its URL."""
    start_worker(redis_url)
    return redis_url


@asynccontextmanager
async def _session(
    broker: str,
    errlog: Any,
    elicitation: ElicitationFnT | None,
    *,
    approve_over_mcp: bool = True,
    client_name: str = CLIENT_NAME,
) -> AsyncIterator[ClientSession]:
    """`cleveragents mcp serve --allow-writes [--approve-over-mcp]` over stdio."""
    opt_in = ["--approve-over-mcp"] if approve_over_mcp else []
    params = StdioServerParameters(
        command=CLEVERAGENTS,
        args=["mcp", "serve", "--allow-writes", *opt_in],
        env=serve_env(broker, CLEVERAGENTS_CATALOGUE=CATALOGUE),
        cwd=REPO,
    )
    info = types.Implementation(name=client_name, version="1.0")
    async with (
        stdio_client(params, errlog=errlog) as (read, write),
        ClientSession(read, write, elicitation_callback=elicitation, client_info=info) as session,
    ):
        with anyio.fail_after(120):
            await session.initialize()
        yield session


def _call(
    broker: str,
    tmp_path: Path,
    arguments: dict[str, Any],
    elicitation: ElicitationFnT | None,
    then: Callable[[], Awaitable[None]] | None = None,
    *,
    approve_over_mcp: bool = True,
    client_name: str = CLIENT_NAME,
) -> tuple[types.CallToolResult, float]:
    """Call `test/send-payment` once: its result, and how long the call took (seconds).

    ``then`` runs after the call, while the session is still open.
    """

    async def scenario() -> tuple[types.CallToolResult, float]:
        with (tmp_path / "serve.log").open("w") as errlog:
            async with _session(
                broker, errlog, elicitation, approve_over_mcp=approve_over_mcp,
                client_name=client_name,
            ) as session:
                started = time.monotonic()
                with anyio.fail_after(90):
                    result = await session.call_tool(_tool_name(), arguments)
                took = time.monotonic() - started
                if then is not None:
                    await then()
                return result, took

    return anyio.run(scenario)


def _meta(result: types.CallToolResult) -> dict[str, Any]:
    assert result.meta is not None, result
    return dict(result.meta)


def _request_id(result: types.CallToolResult) -> str:
    return str(_meta(result)["cleveragents/request_id"])


def _structured(result: types.CallToolResult) -> dict[str, Any]:
    assert result.structured_content is not None, result
    return dict(result.structured_content)


def _answering(
    action: str, content: dict[str, Any] | None, asked: list[types.ElicitRequestFormParams]
) -> ElicitationFnT:
    """An elicitation callback that records each question and answers ``action``."""

    async def answer(
        context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        assert isinstance(params, types.ElicitRequestFormParams), params
        asked.append(params)
        return types.ElicitResult(action=action, content=content)  # type: ignore[arg-type]

    return answer


def test_an_accepted_elicitation_approves_and_the_write_runs(
    fleet: str, client: SkillClient, tmp_path: Path
) -> None:
    log = tmp_path / "payments.jsonl"
    asked: list[types.ElicitRequestFormParams] = []
    accept = _answering("accept", {"reason": "invoice 42 checked"}, asked)

    result, _ = _call(fleet, tmp_path, {"log": str(log), "key": "pay-1"}, accept)

    assert result.is_error is False, text_of(result)
    assert result.structured_content == {"key": "pay-1"}
    assert run_keys(log) == ["pay-1"]
    # The person was asked once, with the skill, the tool and the arguments.
    (question,) = asked
    for named in (SKILL, PAY, '"key": "pay-1"', json.dumps(str(log))):
        assert named in question.message, (named, question.message)
    assert question.requested_schema["properties"]["reason"]["type"] == "string"
    # Their answer is the decision, by the MCP client program's name.
    request_id = _request_id(result)
    assert request_id in question.message
    _, decision = client.approvals.show(request_id)
    assert decision is not None
    assert (decision.outcome, decision.by) == ("approved", f"mcp-client:{CLIENT_NAME}")
    assert decision.reason == "invoice 42 checked"


@pytest.mark.parametrize("action", ["decline", "cancel"])
def test_a_declined_or_cancelled_elicitation_rejects_and_nothing_runs(
    fleet: str, client: SkillClient, tmp_path: Path, action: str
) -> None:
    log = tmp_path / "payments.jsonl"
    asked: list[types.ElicitRequestFormParams] = []

    answer = _answering(action, None, asked)

    result, _ = _call(fleet, tmp_path, {"log": str(log), "key": "pay-2"}, answer)

    assert result.is_error is True
    assert text_of(result).startswith("permission_denied: "), text_of(result)
    details = _meta(result)["cleveragents/error"]["details"]
    assert details["reason"] == "approval_rejected"
    assert (
        details["approval_reason"]
        == {"decline": "declined", "cancel": "cancelled"}[action] + " over MCP"
    )
    assert len(asked) == 1
    assert run_keys(log) == []
    _, decision = client.approvals.show(_request_id(result))
    assert decision is not None
    assert (decision.outcome, decision.by) == ("rejected", f"mcp-client:{CLIENT_NAME}")


def test_without_the_opt_in_a_client_that_accepts_everything_cannot_approve_its_own_write(
    fleet: str, client: SkillClient, tmp_path: Path
) -> None:
    # Given a server without --approve-over-mcp, and a client that names itself after a
    # person and would accept any question it were asked
    log = tmp_path / "payments.jsonl"
    asked: list[types.ElicitRequestFormParams] = []
    accept_all = _answering("accept", {"reason": "looks fine"}, asked)
    arguments = {"log": str(log), "key": "pay-5000000"}

    # When it calls a write that needs approval
    result, took = _call(
        fleet, tmp_path, arguments, accept_all, approve_over_mcp=False, client_name="alice"
    )

    # Then it is never asked, and the answer says how a person approves it, and not to retry
    request_id = _request_id(result)
    assert asked == []
    assert took < 30, took
    assert result.is_error is True
    text = text_of(result)
    assert f"cleveragents approvals approve {request_id}" in text
    assert "approver role" in text
    assert "do not call this tool again" in text
    structured = _structured(result)
    assert structured["state"] == "awaiting_approval"
    assert structured["request_id"] == request_id
    assert structured["approve"] == f"cleveragents approvals approve {request_id}"
    assert structured["approved_by"] == "a person holding the approver role"
    assert structured["call_again"] is False
    # ... and the call stays parked, undecided, not run, with no decision in the trail
    assert request_id in [parked.request_id for parked in client.approvals.pending()]
    _, decision = client.approvals.show(request_id)
    assert decision is None
    assert client.state(request_id) == STATE_AWAITING_APPROVAL
    assert run_keys(log) == []
    events = [event["event"] for event in client.approvals.audit(request_id=request_id)]
    assert not {"approved", "rejected", "started", "succeeded"} & set(events), events


def test_a_client_without_elicitation_is_told_how_to_approve_and_the_call_stays_parked(
    fleet: str, client: SkillClient, tmp_path: Path
) -> None:
    log = tmp_path / "payments.jsonl"

    result, took = _call(fleet, tmp_path, {"log": str(log), "key": "pay-3"}, None)

    request_id = _request_id(result)
    assert took < 30, took
    assert result.is_error is True
    assert f"cleveragents approvals approve {request_id}" in text_of(result)
    assert "approval" in text_of(result)
    assert _structured(result)["state"] == "awaiting_approval"
    assert _structured(result)["request_id"] == request_id
    # It stays parked (the server is gone): listed, undecided, not run.
    assert request_id in [parked.request_id for parked in client.approvals.pending()]
    assert client.state(request_id) == STATE_AWAITING_APPROVAL
    assert run_keys(log) == []
    # Approved as the result says, it runs.
    client.approve(request_id, by="tester")
    assert client.wait(request_id, timeout=60).success
    assert run_keys(log) == ["pay-3"]


def test_an_answer_after_a_decision_taken_elsewhere_does_not_break_the_call(
    fleet: str, client: SkillClient, tmp_path: Path
) -> None:
    log = tmp_path / "payments.jsonl"

    async def approved_meanwhile(
        context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        # Someone approves it from the command line while the person is asked ...
        (parked,) = await anyio.to_thread.run_sync(client.approvals.pending)
        await anyio.to_thread.run_sync(lambda: client.approve(parked.request_id, by="ops"))
        # ... then the person declines: too late, the call ends with the write's result.
        return types.ElicitResult(action="decline")

    result, _ = _call(fleet, tmp_path, {"log": str(log), "key": "pay-4"}, approved_meanwhile)

    assert result.is_error is False, text_of(result)
    assert run_keys(log) == ["pay-4"]
    _, decision = client.approvals.show(_request_id(result))
    assert decision is not None
    assert (decision.outcome, decision.by) == ("approved", "ops")


def test_a_client_that_fails_to_ask_is_told_how_to_approve(
    fleet: str, client: SkillClient, tmp_path: Path
) -> None:
    log = tmp_path / "payments.jsonl"

    async def no_ui(
        context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ErrorData:
        return types.ErrorData(code=types.INVALID_REQUEST, message="no one to ask here")

    result, _ = _call(fleet, tmp_path, {"log": str(log), "key": "pay-5"}, no_ui)

    request_id = _request_id(result)
    assert result.is_error is True
    assert f"cleveragents approvals approve {request_id}" in text_of(result)
    assert _structured(result)["state"] == "awaiting_approval"
    assert request_id in [parked.request_id for parked in client.approvals.pending()]
    assert run_keys(log) == []


def test_a_question_left_open_is_withdrawn_when_the_call_ends(
    fleet: str, client: SkillClient, tmp_path: Path
) -> None:
    log = tmp_path / "payments.jsonl"
    withdrawn: list[bool] = []

    async def never_answers(
        context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        # Someone approves it from the command line; the person never answers.
        (parked,) = await anyio.to_thread.run_sync(client.approvals.pending)
        await anyio.to_thread.run_sync(lambda: client.approve(parked.request_id, by="ops"))
        try:
            await anyio.sleep_forever()
        finally:
            withdrawn.append(True)
        raise AssertionError("unreachable")

    async def question_withdrawn() -> None:  # by the server, while the session is open
        await wait_for(lambda: bool(withdrawn), 15, "the question to be withdrawn")

    arguments = {"log": str(log), "key": "pay-6"}
    result, _ = _call(fleet, tmp_path, arguments, never_answers, question_withdrawn)

    assert result.is_error is False, text_of(result)
    assert run_keys(log) == ["pay-6"]
    assert withdrawn == [True]
