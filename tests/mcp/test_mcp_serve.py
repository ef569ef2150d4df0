"""`cleveragents mcp serve` over stdio, called with the MCP SDK's own client, on a real fleet.

One worker on a private Redis serves the module, and two `cleveragents mcp
serve` subprocesses (spawned by the SDK's stdio client) serve its tests: one as
started by default, one with `--allow-writes`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from mcp import ClientSession
from mcp.shared.exceptions import MCPError

from cleveragents.skills import Catalogue
from cleveragents.skills.mcp_tools import export_catalogue
from tests.support.mcp_support import (
    ECHO,
    MCP_SKILLS,
    SLOW_READ,
    SLOW_WRITE,
    WORD_COUNT,
    Fleet,
    Served,
    running_fleet,
    served,
    text_of,
    wait_for,
)
from tests.support.procs import EXAMPLE_SKILLS, process_alive, wait_until

MCP_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@pytest.fixture(scope="module")
def fleet(session_redis_url: str) -> Iterator[Fleet]:
    with running_fleet(session_redis_url) as running:
        yield running


@pytest.fixture(scope="module")
def portal() -> Iterator[BlockingPortal]:
    with start_blocking_portal() as running:
        yield running


@pytest.fixture(scope="module")
def server(
    fleet: Fleet, portal: BlockingPortal, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """`cleveragents mcp serve` as started by default (no writes)."""
    with served(portal, fleet.broker, tmp_path_factory.mktemp("serve") / "serve.log") as it:
        yield it


@pytest.fixture(scope="module")
def writer(
    fleet: Fleet, portal: BlockingPortal, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """`cleveragents mcp serve --allow-writes`."""
    log = tmp_path_factory.mktemp("serve-writes") / "serve.log"
    with served(portal, fleet.broker, log, "--allow-writes") as it:
        yield it


def cancelled_ids(served: Served) -> list[str]:
    """The request ids the server logged as cancelled, oldest first."""
    return re.findall(r"cancelled (\S+) \(", served.log_text())


def test_tools_list_is_the_catalogue_with_schemas_annotations_and_meta(server: Served) -> None:
    async def scenario(session: ClientSession) -> list[Any]:
        return list((await session.list_tools()).tools)

    listed = server.run(scenario)

    exported = export_catalogue(Catalogue.from_paths(MCP_SKILLS, EXAMPLE_SKILLS)).tools
    # The catalogue, then the server's own look-up tool
    assert [t.name for t in listed] == [*(t["name"] for t in exported), "cleveragents__result"]
    tools = listed[:-1]
    assert all(MCP_NAME.match(t.name) for t in tools)
    by_name = {t.name: t for t in tools}
    echo = by_name[ECHO]
    assert echo.input_schema["required"] == ["text"]
    assert echo.output_schema == {
        "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]
    }
    assert echo.meta["cleveragents/skill"] == "test/mcp"
    assert echo.meta["cleveragents/tool"] == "test/echo"
    assert echo.annotations.read_only_hint is True
    assert echo.annotations.idempotent_hint is True
    write = by_name[SLOW_WRITE].annotations
    assert (write.read_only_hint, write.destructive_hint) == (False, True)
    # A long skill name gets the deterministic short form; _meta keeps the real names.
    long_skill = "test/a-skill-whose-name-is-far-too-long-for-one-mcp-tool-name"
    reached = [t for t in tools if t.meta["cleveragents/skill"] == long_skill]
    assert sorted(t.meta["cleveragents/tool"] for t in reached) == [
        "test/echo", "test/slow-read", "test/slow-write"
    ]
    assert all(re.search(r"-[0-9a-f]{8}$", t.name) for t in reached)


def test_a_read_tool_answers_with_structured_content_and_a_json_text_block(
    server: Served,
) -> None:
    result = server.call(WORD_COUNT, {"text": "one two three"})

    assert result.is_error is False
    assert result.structured_content == {"words": 3}
    assert '"words": 3' in text_of(result)
    assert result.meta["cleveragents/request_id"]


def test_bad_arguments_are_an_error_naming_validation_error(server: Served) -> None:
    result = server.call(ECHO, {"text": 42})

    assert result.is_error is True
    assert text_of(result).startswith("validation_error: ")
    assert "arguments.text" in text_of(result)
    assert result.meta["cleveragents/error"]["error_type"] == "validation_error"


def test_an_unknown_tool_is_a_protocol_error(server: Served) -> None:
    with pytest.raises(MCPError, match="unknown tool: no_such__tool"):
        server.call("no_such__tool", {})


def test_a_write_is_refused_without_allow_writes_and_nothing_runs(
    server: Served, writer: Served, fleet: Fleet, tmp_path: Path
) -> None:
    target = tmp_path / "written.txt"
    received = _received(fleet)

    result = server.call(SLOW_WRITE, {"path": str(target)})

    assert result.is_error is True
    assert text_of(result).startswith("permission_denied: ")
    assert "--allow-writes" in text_of(result)
    assert "cleveragents/request_id" not in result.meta  # never submitted
    # A write sent after it (through the other server) is the one message the worker
    # receives: had the refused write been sent, it would have been received first
    after = writer.call(SLOW_WRITE, {"path": str(tmp_path / "after.txt")})
    assert after.is_error is False, text_of(after)
    assert _received(fleet) == received + 1
    assert not target.exists()


def _received(fleet: Fleet) -> int:
    """How many messages the fleet's worker has received (its log)."""
    return fleet.worker.log_text().count("] received")


def test_a_write_runs_when_the_server_allows_writes(writer: Served, tmp_path: Path) -> None:
    target = tmp_path / "written.txt"

    result = writer.call(SLOW_WRITE, {"path": str(target)})

    assert result.is_error is False, text_of(result)
    assert result.structured_content == {"lines": 2}
    assert target.read_text() == "start\ndone\n"


def test_a_slow_call_reports_progress_when_the_client_asks(server: Served) -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    result = server.call(SLOW_READ, {"seconds": 2.5}, progress_callback=on_progress)

    assert result.structured_content == {"slept": 2.5}
    assert len(seen) >= 2, seen
    progress = [p for p, _, _ in seen]
    assert progress == sorted(set(progress))  # strictly increasing
    assert "running" in {m for _, _, m in seen}


def call_then_cancel(
    served: Served, name: str, arguments: dict[str, Any], ready: Callable[[], bool]
) -> str:
    """Call ``name``; once ``ready()`` holds, cancel the call; the id the server cancelled.

    Cancelling the SDK client's call sends ``notifications/cancelled``.
    """
    before = len(cancelled_ids(served))

    async def scenario(session: ClientSession) -> None:
        scope = anyio.CancelScope()

        async def call() -> None:
            with scope:
                await session.call_tool(name, arguments)

        async with anyio.create_task_group() as group:
            group.start_soon(call)
            await wait_for(ready, 30, "the call to get going")
            scope.cancel()
        await wait_for(lambda: len(cancelled_ids(served)) > before, 15, "the cancel logged")

    served.run(scenario)
    return cancelled_ids(served)[before]


def test_cancelling_a_running_read_stops_the_tool(
    server: Served, fleet: Fleet, tmp_path: Path
) -> None:
    started, finished = tmp_path / "started", tmp_path / "finished"
    arguments = {"seconds": 3, "started": str(started), "marker": str(finished)}

    request_id = call_then_cancel(server, SLOW_READ, arguments, started.exists)

    # The worker process running it is sent SIGTERM (Celery revoke with terminate):
    # the invocation ends as revoked, or as failed where the tool's unwinding is
    # recorded first; either way it never finishes.
    with fleet.client() as client:
        ended = ("REVOKED", "FAILURE")
        wait_until(lambda: client.state(request_id) in ended, 15, "the read to be stopped")
    assert f"cancelled {request_id}" in server.log_text()
    # The pool process that ran it was sent SIGTERM: once it is gone the tool cannot finish
    ran_in = int(started.read_text())
    wait_until(lambda: not process_alive(ran_in), 15, "the process that ran the read to end")
    assert not finished.exists()


def test_cancelling_a_queued_invocation_revokes_it_so_it_never_runs(
    writer: Served, fleet: Fleet, tmp_path: Path
) -> None:
    # Given both worker processes busy, so the next invocation waits in the queue.
    target = tmp_path / "written.txt"
    busy = [tmp_path / "busy-1", tmp_path / "busy-2"]
    with fleet.client() as client:
        # (Only the ids are kept: a handle outliving its client fails in its __del__.)
        blockers = [
            client.submit(
                "test/mcp", "test/slow-read", {"seconds": 30, "started": str(path)}
            ).request_id
            for path in busy
        ]
        wait_until(lambda: all(p.exists() for p in busy), 30, "both worker processes busy")
        # When a queued write is cancelled, then the workers free up.
        request_id = call_then_cancel(writer, SLOW_WRITE, {"path": str(target)}, _after(1.0))
        assert not target.exists()
        for blocker in blockers:
            client.revoke(blocker, terminate=True)
        # Then it is revoked and never runs.
        wait_until(lambda: client.state(request_id) == "REVOKED", 20, "the write revoked")
    # The worker took it off the queue and dropped it (and acknowledged it): it never runs
    discarded = f"Discarding revoked task: skills.invoke[{request_id}]"
    wait_until(lambda: discarded in fleet.worker.log_text(), 15, "the write to be discarded")
    assert not target.exists()


def test_cancelling_a_running_write_leaves_it_to_finish(
    writer: Served, fleet: Fleet, tmp_path: Path
) -> None:
    target = tmp_path / "written.txt"

    request_id = call_then_cancel(
        writer, SLOW_WRITE, {"path": str(target), "seconds": 1.5}, target.exists
    )

    wait_until(lambda: target.read_text() == "start\ndone\n", 15, "the write to finish")
    assert f"cancelled {request_id}" in writer.log_text()
    assert "left to finish" in writer.log_text()
    with fleet.client() as client:
        wait_until(lambda: client.state(request_id) == "SUCCESS", 15, "its result")


def _after(seconds: float) -> Callable[[], bool]:
    import time

    ready_at = time.monotonic() + seconds
    return lambda: time.monotonic() >= ready_at
