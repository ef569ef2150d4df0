"""Approvals over MCP 2026-07-28: the question travels in an ``input_required`` result.

Pydantic AI's MCP client (FastMCP's) speaks MCP 2026-07-28, where a server may not
send a request during a call (issue 48, item 2). With ``--approve-over-mcp``, a call
whose invocation is parked answers ``input_required``: an elicitation form and a
sealed ``requestState``; the client asks its approval handler and calls again with
the answer and the state. Accept approves the digest of the call shown and the write
runs once; decline rejects it and nothing runs. A state the client changed, or one
moved to another call, is refused and decides nothing. On a real worker on Redis,
with the real Pydantic AI agent (``TestModel``) over stdio and the SDK's client over
HTTP.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from fastmcp.client.elicitation import ElicitResult
from fastmcp.client.transports import StdioTransport
from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from pydantic_ai import Agent
from pydantic_ai.exceptions import UnexpectedModelBehavior
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.models.test import TestModel

from cleveragents.client import SkillClient
from cleveragents.constants import STATE_AWAITING_APPROVAL
from cleveragents.mcp.naming import ToolTable
from cleveragents.skills import Catalogue
from tests.support.mcp_support import CLEVERAGENTS, http_server, serve_env
from tests.support.procs import EXAMPLE_SKILLS, REPO, Worker
from tests.support.worker_runs import run_keys

pytestmark = pytest.mark.timeout(240)

#: The name Pydantic AI's client gives in each request's ``_meta`` (``clientInfo.name``).
CLIENT_NAME = "pai-desk"
SKILL_FILE = """\
name: test/pai-payments
description: A payment a person approves; TestModel fills in its arguments
tools:
  - name: test/pai-pay
    description: Records a payment; a person approves each one first
    source: python
    entrypoint: tests.fixtures.policy_tools:work
    writes: true
    requires_approval: true
    input_schema:
      type: object
      properties:
        log: {{type: string, const: {log}}}
        key: {{type: string, enum: [pay-yes, pay-no]}}
      required: [log, key]
      additionalProperties: false
"""


def _catalogue(tmp_path: Path) -> tuple[str, Path]:
    """A catalogue with ``test/pai-pay`` (its ``log`` fixed to a file of this test)."""
    log = tmp_path / "payments.jsonl"
    skills = tmp_path / "skills"
    skills.mkdir()
    (skills / "pai.yaml").write_text(SKILL_FILE.format(log=json.dumps(str(log))))
    return os.pathsep.join([str(skills), str(EXAMPLE_SKILLS)]), log


def _tool_name(catalogue: str) -> str:
    paths = [Path(p) for p in catalogue.split(os.pathsep)]
    table = ToolTable.from_catalogue(Catalogue.from_paths(*paths))
    (name,) = [r.name for r in table.routes.values() if r.tool == "test/pai-pay"]
    return name


@pytest.fixture
def fleet(
    redis_url: str, start_worker: Callable[..., Worker], tmp_path: Path
) -> tuple[str, str, Path]:
    """A worker with the test's catalogue on the test Redis: its URL, the catalogue, the log."""
    catalogue, log = _catalogue(tmp_path)
    start_worker(redis_url, CLEVERAGENTS_CATALOGUE=catalogue)
    return redis_url, catalogue, log


def _pydantic_ai_toolset(
    broker: str, catalogue: str, serve_log: Path, asked: list[str]
) -> MCPToolset:
    """Pydantic AI's MCP client to ``mcp serve --approve-over-mcp``: its approval handler
    records each question, accepts the pay-yes call and declines the pay-no one."""

    async def approval_handler(message: str, response_type: Any, params: Any, context: Any) -> Any:
        asked.append(message)
        key = "pay-yes" if "pay-yes" in message else "pay-no"
        action = "accept" if key == "pay-yes" else "decline"
        return ElicitResult(action=action, content={"reason": f"{key} checked"})

    transport = StdioTransport(
        CLEVERAGENTS,
        ["mcp", "serve", "--allow-writes", "--approve-over-mcp"],
        env=serve_env(broker, CLEVERAGENTS_CATALOGUE=catalogue),
        cwd=str(REPO),
        log_file=serve_log,
    )
    return MCPToolset(
        transport,
        elicitation_handler=approval_handler,
        client_info=types.Implementation(name=CLIENT_NAME, version="1.0"),
        init_timeout=60,  # the server's start, on a loaded machine (the default is 5 s)
    )


async def _two_agent_runs(toolset: MCPToolset, tool: str) -> dict[str, str]:
    """One agent run whose call is approved, one whose call is declined (on every retry)."""
    outcomes: dict[str, str] = {}
    # TestModel calls the tool with key pay-yes (seed 0) or pay-no (seed 1)
    approving = Agent(TestModel(call_tools=[tool], seed=0), toolsets=[toolset])
    declining = Agent(TestModel(call_tools=[tool], seed=1), toolsets=[toolset])
    with anyio.fail_after(150):
        async with toolset:
            outcomes["approved"] = (await approving.run("Pay the invoice")).output
            try:
                await declining.run("Pay the other invoice")
            except UnexpectedModelBehavior as refused:  # the agent retried, refused again
                outcomes["declined"] = str(refused)
    return outcomes


def test_pydantic_ai_approval_handler_is_asked_and_its_answer_decides(
    fleet: tuple[str, str, Path], client: SkillClient, tmp_path: Path
) -> None:
    broker, catalogue, log = fleet
    asked: list[str] = []
    toolset = _pydantic_ai_toolset(broker, catalogue, tmp_path / "serve.log", asked)

    outcomes = anyio.run(_two_agent_runs, toolset, _tool_name(catalogue))

    # The handler was asked, with the skill, the tool and the arguments
    assert asked, (tmp_path / "serve.log").read_text()
    assert "test/pai-pay" in asked[0], asked[0]
    assert '"key": "pay-yes"' in asked[0], asked[0]
    # Approving ran the write once, and the agent got its result
    assert run_keys(log) == ["pay-yes"]
    assert "pay-yes" in outcomes["approved"], outcomes
    # Declining ran nothing: the agent's retries were asked again and refused again
    assert "declined" in outcomes, outcomes
    assert all("pay-no" in question for question in asked[1:]), asked
    # Each answer is a decision over MCP, by the client program's name, of what was shown
    events = client.approvals.audit()
    decided = [e for e in events if e["event"] in ("approved", "rejected")]
    assert [e["event"] for e in decided].count("approved") == 1, decided
    assert len(decided) == len(asked), (decided, asked)
    for event in decided:
        record, decision = client.approvals.show(event["request_id"])
        assert decision is not None
        assert decision.by == f"mcp-client:{CLIENT_NAME}", decision
        assert decision.channel == "mcp", decision
        assert decision.digest == record.digest, decision


#: The answer the hand-driven client sends: accept.
ACCEPT = {"approval": types.ElicitResult(action="accept", content={})}


async def _input_required(session: ClientSession, tool: str, key: str, log: Path) -> Any:
    """Call the tool at 2026-07-28 and return the ``input_required`` answer it gets."""
    answer = await session.call_tool(
        tool, {"log": str(log), "key": key}, allow_input_required=True
    )
    assert isinstance(answer, types.InputRequiredResult), answer
    return answer


async def _refused(session: ClientSession, tool: str, arguments: dict[str, Any], state: str) -> str:
    """The error a call sent again with ``state`` gets: it must be refused."""
    with pytest.raises(MCPError) as error:
        await session.call_tool(tool, arguments, input_responses=dict(ACCEPT), request_state=state)
    return str(error.value)


async def _tampering(url: str, tool: str, log: Path, client: SkillClient) -> dict[str, Any]:
    """Two parked calls; a changed state, a state moved to the other call, then the genuine one."""
    outcome: dict[str, Any] = {}
    async with (
        httpx2.AsyncClient() as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(
            read,
            write,
            elicitation_callback=_never_called,
            client_info=types.Implementation(name=CLIENT_NAME, version="1"),
        ) as session,
    ):
        with anyio.fail_after(150):
            outcome["versions"] = (await session.discover()).supported_versions
            yes = await _input_required(session, tool, "pay-yes", log)
            outcome["questions"] = [yes, await _input_required(session, tool, "pay-no", log)]
            state = yes.request_state
            # When a state with one character changed comes back, it is refused
            flipped = state[:-2] + ("A" if state[-2] != "A" else "B") + state[-1]
            paying = {"log": str(log), "key": "pay-yes"}
            outcome["refusals"] = [await _refused(session, tool, paying, flipped)]
            # ... and so is the state of one call sent with another call's arguments
            other = {"log": str(log), "key": "pay-no"}
            outcome["refusals"].append(await _refused(session, tool, other, state))
            outcome["pending"] = await anyio.to_thread.run_sync(client.approvals.pending)
            # The genuine state, with the call it was given for, approves and runs
            outcome["done"] = await session.call_tool(
                tool, paying, input_responses=dict(ACCEPT), request_state=state
            )
    return outcome


def test_a_tampered_or_moved_request_state_is_refused_and_decides_nothing(
    fleet: tuple[str, str, Path], client: SkillClient, tmp_path: Path
) -> None:
    # Given the SDK's client at MCP 2026-07-28 over HTTP, driving the retries by hand
    broker, catalogue, log = fleet
    env = serve_env(broker, CLEVERAGENTS_CATALOGUE=catalogue)
    with http_server(env, tmp_path / "serve.log", "--allow-writes", "--approve-over-mcp") as server:
        outcome = anyio.run(_tampering, server.url, _tool_name(catalogue), log, client)
        serve_log = server.log_text()

    assert "2026-07-28" in outcome["versions"]
    # Then both were refused before anything was decided: both calls still parked, none ran
    assert len(outcome["refusals"]) == 2, outcome["refusals"]
    assert serve_log.count("request state refused") == 2, serve_log
    parked = {p.body["arguments"]["key"]: p.request_id for p in outcome["pending"]}
    assert set(parked) == {"pay-yes", "pay-no"}, parked
    # ... and the genuine state decided its own call only
    done = outcome["done"]
    assert isinstance(done, types.CallToolResult), done
    assert done.is_error is False, done
    assert done.structured_content == {"key": "pay-yes"}
    assert done.meta is not None
    assert done.meta["cleveragents/request_id"] == parked["pay-yes"]
    assert run_keys(log) == ["pay-yes"]
    assert client.state(parked["pay-no"]) == STATE_AWAITING_APPROVAL
    # The question showed the call and named its invocation
    first = outcome["questions"][0]
    (request,) = first.input_requests.values()
    assert isinstance(request, types.ElicitRequest), request
    assert '"key": "pay-yes"' in request.params.message
    assert first.meta["cleveragents/request_id"] == parked["pay-yes"]


async def _never_called(context: Any, params: Any) -> types.ElicitResult:
    raise AssertionError("the server sent an elicitation request during a 2026-07-28 call")

