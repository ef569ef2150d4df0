"""A parked call over MCP: the agent is told not to retry, a retry joins it, its outcome is known.

Agent frameworks turn an error result into a retry and feed the model the
structured content (issue 48, item 3): so an identical call from the same session
joins the parked invocation instead of parking another, the structured content
says `retry: false` with a `next_step`, and the server's own tool
`cleveragents__result` tells what became of a request. The server logs why the
client was not asked (issue 48, item 2). On a real worker on Redis, over stdio,
with the SDK's client.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client, types

from cleveragents.client import SkillClient
from cleveragents.mcp.naming import ToolTable
from cleveragents.skills import Catalogue
from tests.support.mcp_support import CLEVERAGENTS, serve_env, text_of
from tests.support.procs import EXAMPLE_SKILLS, FIXTURE_SKILLS, REPO, Worker
from tests.support.worker_runs import run_keys

pytestmark = pytest.mark.timeout(240)

SKILL, PAY = "test/approvals", "test/send-payment"
CATALOGUE = os.pathsep.join([str(FIXTURE_SKILLS), str(EXAMPLE_SKILLS)])
RESULT_TOOL = "cleveragents__result"


def _tool_name() -> str:
    table = ToolTable.from_catalogue(Catalogue.from_paths(FIXTURE_SKILLS, EXAMPLE_SKILLS))
    (name,) = [r.name for r in table.routes.values() if (r.skill, r.tool) == (SKILL, PAY)]
    return name


@pytest.fixture
def fleet(redis_url: str, start_worker: Callable[..., Worker]) -> str:
    start_worker(redis_url)
    return redis_url


def _request_id(result: types.CallToolResult) -> str:
    assert result.meta is not None, result
    return str(result.meta["cleveragents/request_id"])


def test_a_retried_parked_call_joins_it_and_its_outcome_can_be_looked_up(
    fleet: str, client: SkillClient, tmp_path: Path
) -> None:
    log = tmp_path / "payments.jsonl"
    arguments = {"log": str(log), "key": "pay-join"}
    params = StdioServerParameters(
        command=CLEVERAGENTS,
        args=["mcp", "serve", "--allow-writes"],
        env=serve_env(fleet, CLEVERAGENTS_CATALOGUE=CATALOGUE),
        cwd=REPO,
    )
    answers: dict[str, Any] = {}

    async def scenario() -> None:
        with (tmp_path / "serve.log").open("w") as errlog:
            async with (
                stdio_client(params, errlog=errlog) as (read, write),
                ClientSession(read, write) as session,
            ):
                with anyio.fail_after(120):
                    await session.initialize()
                    answers["listed"] = [t.name for t in (await session.list_tools()).tools]
                    # Given a call parked for approval, retried as a framework retries it
                    answers["first"] = await session.call_tool(_tool_name(), arguments)
                    answers["retry"] = await session.call_tool(_tool_name(), arguments)
                    # ... and another call, with other arguments
                    other = {"log": str(log), "key": "pay-other"}
                    answers["other"] = await session.call_tool(_tool_name(), other)
                    request_id = _request_id(answers["first"])
                    answers["waiting"] = await session.call_tool(
                        RESULT_TOOL, {"request_id": request_id}
                    )
                    # When a person approves it, the look-up gives its result
                    await anyio.to_thread.run_sync(
                        lambda: client.approve(request_id, by="tester")
                    )
                    await anyio.to_thread.run_sync(
                        lambda: client.wait(request_id, timeout=60)
                    )
                    answers["done"] = await session.call_tool(
                        RESULT_TOOL, {"request_id": request_id}
                    )
                    answers["unknown"] = await session.call_tool(
                        RESULT_TOOL, {"request_id": "no-such-request"}
                    )

    anyio.run(scenario)

    first, retry, other = answers["first"], answers["retry"], answers["other"]
    request_id = _request_id(first)
    # The retry joined the parked invocation: one parked call for one intent
    assert _request_id(retry) == request_id
    assert _request_id(other) != request_id
    pending = [p.request_id for p in client.approvals.pending()]
    assert request_id not in pending  # approved since
    assert _request_id(other) in pending
    # ... and no second invocation of the same payment waits
    keys = [p.body.get("arguments", {}).get("key") for p in client.approvals.pending()]
    assert keys.count("pay-join") == 0, keys
    # The structured content itself says not to retry, and what to do next
    structured = dict(first.structured_content or {})
    assert structured["state"] == "awaiting_approval"
    assert structured["retry"] is False
    assert RESULT_TOOL in structured["next_step"]
    assert "Do not retry" in structured["next_step"]
    # ... and why the client was not asked: no --approve-over-mcp
    assert "--approve-over-mcp" in structured["not_asked_because"]
    assert "--approve-over-mcp" in text_of(first)
    serve_log = (tmp_path / "serve.log").read_text()
    assert "the client is not asked: this server does not ask MCP clients" in serve_log
    assert "joins invocation " + request_id in serve_log
    # The look-up tool is listed, and tells the state, then the result
    assert RESULT_TOOL in answers["listed"]
    waiting = dict(answers["waiting"].structured_content or {})
    assert (waiting["state"], waiting["request_id"]) == ("awaiting_approval", request_id)
    assert answers["waiting"].is_error is not True
    done = dict(answers["done"].structured_content or {})
    assert done["state"] == "succeeded"
    assert done["result"]["success"] is True
    assert done["result"]["output_data"] == {"key": "pay-join"}
    assert dict(answers["unknown"].structured_content or {})["state"] == "unknown"
    assert run_keys(log) == ["pay-join"]


def test_a_refused_write_says_not_to_retry(fleet: str, tmp_path: Path) -> None:
    params = StdioServerParameters(
        command=CLEVERAGENTS,
        args=["mcp", "serve"],  # no --allow-writes
        env=serve_env(fleet, CLEVERAGENTS_CATALOGUE=CATALOGUE),
        cwd=REPO,
    )

    async def scenario() -> types.CallToolResult:
        async with (
            stdio_client(params) as (read, write),
            ClientSession(read, write) as session,
        ):
            with anyio.fail_after(120):
                await session.initialize()
                return await session.call_tool(_tool_name(), {"log": "x", "key": "k"})

    refused = anyio.run(scenario)

    assert refused.is_error is True
    structured = dict(refused.structured_content or {})
    assert structured["state"] == "refused"
    assert structured["error_type"] == "permission_denied"
    assert structured["retry"] is False
    assert "Do not retry" in structured["next_step"]
