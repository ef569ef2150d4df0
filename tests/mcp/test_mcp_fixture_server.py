"""The SDK-built fixture remote (tests/fixtures/mcp_server.py) behaves as its docstring says.

Other suites use it as the remote MCP server (imports, ``source: mcp`` tools): its
failure modes must be real before anything is concluded from them.
"""

from __future__ import annotations

import sys
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError

from tests.support.procs import REPO


async def _with_fixture(scenario: Any) -> Any:
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "tests.fixtures.mcp_server"], cwd=REPO
    )
    async with (
        stdio_client(params) as (read, write),
        ClientSession(read, write) as session,
    ):
        with anyio.fail_after(60):
            await session.initialize()
            return await scenario(session)


def test_the_fixture_answers_structured_results_errors_progress_and_can_die() -> None:
    reported: list[float] = []
    answers: list[Any] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        reported.append(progress)

    async def scenario(session: ClientSession) -> None:
        answers.append(await session.call_tool("lookup", {"key": "beta"}))
        answers.append(await session.call_tool("fail", {"message": "remote says no"}))
        answers.append(
            await session.call_tool("sleep", {"seconds": 0.5}, progress_callback=on_progress)
        )
        answers.append(await session.call_tool("lookup", {"key": 3}))
        await session.call_tool("exit_server", {})

    # Dying mid-call: the SDK's client raises MCPError "Connection closed" (in task groups).
    with pytest.raises(ExceptionGroup) as raised:
        anyio.run(_with_fixture, scenario)

    found, failed, slept, bad = answers
    assert found.structured_content == {"key": "beta", "value": 2, "found": True}
    assert failed.is_error is True
    assert failed.content[0].text == "Error executing tool fail: remote says no"
    assert slept.structured_content == {"slept": 0.5}
    assert reported == pytest.approx([0.2, 0.4, 0.5])
    assert bad.is_error is True
    leaf: BaseException = raised.value
    while isinstance(leaf, BaseExceptionGroup):
        leaf = leaf.exceptions[0]
    assert isinstance(leaf, MCPError)
    assert leaf.message == "Connection closed"
