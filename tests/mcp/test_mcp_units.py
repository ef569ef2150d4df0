"""The pure parts of `cleveragents.mcp`: names and routes, results, the HTTP guard, stdin lines."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import anyio
import pytest
from mcp import ClientSession, types
from mcp.shared.memory import create_client_server_memory_streams
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from cleveragents.client import SkillClient
from cleveragents.errors import ConfigurationError
from cleveragents.mcp import (
    BearerGuard,
    FleetTools,
    ToolTable,
    build_server,
    call_result,
    check_http_options,
    is_loopback,
)
from cleveragents.mcp.approval_prompt import asks_in_result, why_not_asked
from cleveragents.mcp.call_results import writes_refused
from cleveragents.mcp.result_tool import bad_lookup, outcome_of
from cleveragents.mcp.stdio import PipeLines, pipe_lines
from cleveragents.skills import Catalogue, SkillResult
from cleveragents.skills.mcp_tools import export_catalogue
from tests.support.procs import EXAMPLE_SKILLS


@pytest.fixture(scope="module")
def table() -> ToolTable:
    return ToolTable.from_catalogue(Catalogue.from_paths(EXAMPLE_SKILLS))


def test_the_tool_table_lists_what_skills_export_prints_and_routes_back(table: ToolTable) -> None:
    catalogue = Catalogue.from_paths(EXAMPLE_SKILLS)
    assert list(table.tools) == export_catalogue(catalogue).tools
    for name, route in table.routes.items():
        entries = catalogue.resolve(route.skill).resolved_tools
        [tool] = [e.tool for e in entries if e.tool.name == route.tool]
        assert route.name == name
        assert route.write_capable is tool.write_capable
    assert table.route("local_notes__local_write-note").write_capable is True  # type: ignore[union-attr]
    assert table.route("no_such__tool") is None


def test_a_success_is_structured_content_and_a_json_text_block() -> None:
    result = SkillResult(
        skill_name="a/s", tool_name="a/t", success=True, output_data={"n": 1},
        resource_changes=[{"action": "created", "resource": "x"}],
    )

    answer = call_result(result, "r-1")

    assert answer.is_error is False
    assert answer.structured_content == {"n": 1}
    assert [block.text for block in answer.content] == ['{"n": 1}']  # type: ignore[union-attr]
    assert answer.meta == {
        "cleveragents/request_id": "r-1",
        "cleveragents/resource_changes": [{"action": "created", "resource": "x"}],
    }


def test_output_that_is_not_an_object_is_wrapped_for_structured_content() -> None:
    result = SkillResult(skill_name="a/s", tool_name="a/t", success=True, output_data=[1, 2])

    answer = call_result(result, "r-2")

    assert answer.structured_content == {"result": [1, 2]}
    assert answer.content[0].text == "[1, 2]"  # type: ignore[union-attr]


def test_a_text_output_is_the_text_itself_in_the_text_block() -> None:
    result = SkillResult(skill_name="a/s", tool_name="a/t", success=True, output_data="hello")

    answer = call_result(result, "r-3")

    assert answer.content[0].text == "hello"  # type: ignore[union-attr]
    assert answer.structured_content == {"result": "hello"}


def test_a_stdio_server_that_exits_at_once_is_said_with_the_end_of_its_stderr(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "cleveragents", "skills", "import", "--from-mcp", "--name",
         "ext/x", "--command", "sh", "-c", "echo first >&2; echo bad token >&2; exit 3"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False,
    )
    assert done.returncode != 0
    [line] = [ln for ln in done.stderr.splitlines() if ln.startswith("error:")]
    assert "the server exited (or closed its stdout) before it answered" in line
    assert line.endswith("its stderr ends: first | bad token")
    assert "Connection closed" not in line


def test_a_refused_write_is_an_error_naming_permission_denied(table: ToolTable) -> None:
    route = table.route("local_notes__local_write-note")
    assert route is not None

    answer = call_result(writes_refused(route), None)

    assert answer.is_error is True
    text = answer.content[0].text  # type: ignore[union-attr]
    assert text.startswith("permission_denied: tool local/write-note of skill local/notes")
    assert answer.meta is not None
    error = answer.meta["cleveragents/error"]
    assert error["details"]["gate"] == "mcp_server_disallows_writes"
    assert "cleveragents/request_id" not in answer.meta


class _NoQueue:
    """A client that fails the test if anything is built or sent."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the client was used: {name}")


def test_without_allow_writes_a_write_call_never_reaches_the_client(table: ToolTable) -> None:
    tools = FleetTools(table, cast(SkillClient, _NoQueue()), allow_writes=False)
    params = types.CallToolRequestParams(name="local_notes__local_write-note", arguments={})

    answer = anyio.run(tools.call_tool, cast(Any, None), params)

    assert isinstance(answer, types.CallToolResult)
    assert answer.is_error is True


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True), ("127.4.5.6", True), ("::1", True), ("[::1]", True),
        ("localhost", True), ("LocalHost", True), ("0.0.0.0", False), ("::", False),
        ("192.168.1.10", False), ("example.com", False),
    ],
)
def test_only_loopback_addresses_count_as_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_http_off_loopback_needs_a_token() -> None:
    with pytest.raises(ConfigurationError, match="CLEVERAGENTS_MCP_TOKEN"):
        check_http_options("0.0.0.0", None)
    check_http_options("0.0.0.0", "token")
    check_http_options("127.0.0.1", None)


async def _app(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def _status(guard: BearerGuard, headers: list[tuple[bytes, bytes]]) -> int:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    anyio.run(cast(Any, guard), {"type": "http", "headers": headers}, receive, send)
    return int(sent[0]["status"])


@pytest.mark.parametrize(
    ("authorization", "status"),
    [
        (b"Bearer tok", 200), (b"bearer tok", 200), (b"Bearer tok2", 401), (b"Bearer to", 401),
        (b"Basic tok", 401), (b"tok", 401), (None, 401),
    ],
)
def test_the_guard_lets_through_only_the_bearer_token(
    authorization: bytes | None, status: int
) -> None:
    headers = [] if authorization is None else [(b"authorization", authorization)]
    assert _status(BearerGuard(_app, "tok"), headers) == status


def test_pipe_lines_reads_whole_lines_then_the_rest_then_stops() -> None:
    read_end, write_end = os.pipe()
    os.write(write_end, b'{"a": 1}\n{"b": \xff}\nlast')
    os.close(write_end)

    async def read_all() -> list[str]:
        return [line async for line in PipeLines(read_end)]

    try:
        assert anyio.run(read_all) == ['{"a": 1}\n', '{"b": \ufffd}\n', "last"]
    finally:
        os.close(read_end)


def test_pipe_lines_is_only_for_pipes(tmp_path: Path) -> None:
    with (tmp_path / "file").open("w") as handle:
        assert pipe_lines(handle.fileno()) is None


def test_the_cli_does_not_import_the_mcp_sdk_until_an_mcp_command_runs() -> None:
    code = "import sys, cleveragents.cli; print('mcp' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


class _StubQueue:
    """A client double: records what is sent and revoked, answers with scripted states."""

    def __init__(
        self, states: list[str], result: SkillResult | None = None, *, embedded: bool = False
    ) -> None:
        self.states = states
        self.result = result
        self.embedded = embedded
        self.sent: list[str] = []
        self.revoked: list[tuple[str, bool]] = []

    def build_request(self, *args: Any, **kwargs: Any) -> Any:
        return SkillClient.build_request(cast(SkillClient, self), *args, **kwargs)

    def send(self, request: Any, *, skip_if_done: bool = True, trace: Any = None) -> None:
        self.sent.append(request.request_id)

    def get(self, request_id: str) -> SkillResult | None:
        return self.result if len(self.states) <= 1 else None

    def state(self, request_id: str) -> str:
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]

    def revoke(self, request_id: str, *, terminate: bool = False) -> bool:
        self.revoked.append((request_id, terminate))
        return not self.embedded


class _Session:
    """What the handler needs of the request context: a session that takes progress."""

    def __init__(self) -> None:
        self.progress: list[tuple[float, float | None, str | None]] = []

    async def report_progress(
        self, progress: float, total: float | None = None, message: str | None = None
    ) -> None:
        self.progress.append((progress, total, message))


class _Context:
    def __init__(self) -> None:
        self.session = _Session()
        self.request = None  # the transport's request: none on stdio


def _call(tools: FleetTools, name: str) -> types.CallToolResult:
    params = types.CallToolRequestParams(name=name, arguments={"text": "a b"})
    answer = anyio.run(tools.call_tool, cast(Any, _Context()), params)
    assert isinstance(answer, types.CallToolResult)
    return answer


def test_an_invocation_revoked_elsewhere_ends_the_call_with_an_error(table: ToolTable) -> None:
    queue = _StubQueue(["PENDING", "REVOKED"])
    tools = FleetTools(table, cast(SkillClient, queue), progress_interval_s=0.0)

    answer = _call(tools, "local_text-tools__local_word-count")

    assert len(queue.sent) == 1
    assert answer.is_error is True
    assert "was revoked before it ended" in answer.content[0].text  # type: ignore[union-attr]


def test_a_waiting_call_reports_queued_then_running(table: ToolTable) -> None:
    done = SkillResult(skill_name="s/s", tool_name="t/t", success=True, output_data={"words": 2})
    queue = _StubQueue(["PENDING", "STARTED", "STARTED", "SUCCESS"], done)
    tools = FleetTools(table, cast(SkillClient, queue), progress_interval_s=0.0)
    context = _Context()
    params = types.CallToolRequestParams(
        name="local_text-tools__local_word-count", arguments={"text": "a b"}
    )

    answer = anyio.run(tools.call_tool, cast(Any, context), params)

    assert isinstance(answer, types.CallToolResult)
    assert answer.structured_content == {"words": 2}
    assert [m for _, _, m in context.session.progress] == ["queued", "running", "running"]


@pytest.mark.parametrize(
    ("name", "state", "embedded", "revoked", "logged"),
    [
        ("local_text-tools__local_word-count", "STARTED", False, True, "revoked (it was running)"),
        ("local_text-tools__local_word-count", "PENDING", False, True, "revoked (it was queued)"),
        ("local_notes__local_write-note", "PENDING", False, False, "revoked (it was queued)"),
        ("local_notes__local_write-note", "STARTED", False, False, "left to finish"),
        ("local_text-tools__local_word-count", "STARTED", True, True, "cannot revoke it"),
        ("local_text-tools__local_word-count", "SUCCESS", False, None, "after it ended"),
    ],
)
def test_a_cancelled_call_stops_reads_never_running_writes(
    table: ToolTable,
    caplog: pytest.LogCaptureFixture,
    name: str,
    state: str,
    embedded: bool,
    revoked: bool | None,
    logged: str,
) -> None:
    queue = _StubQueue([state], embedded=embedded)
    tools = FleetTools(table, cast(SkillClient, queue), allow_writes=True)
    route = table.route(name)
    assert route is not None

    with caplog.at_level("INFO", logger="cleveragents.mcp"):
        tools.cancel(route, "r-9")

    assert queue.revoked == ([] if revoked is None else [("r-9", revoked)])
    assert logged in caplog.text


def test_the_mcp_token_is_read_with_the_settings_and_never_shown() -> None:
    from cleveragents.mcp import ServeOptions
    from cleveragents.settings import Settings

    settings = Settings.from_env({"CLEVERAGENTS_MCP_TOKEN": " s3cret "})

    assert settings.mcp_token == "s3cret"
    assert "s3cret" not in repr(settings)
    assert "s3cret" not in repr(ServeOptions(token=settings.mcp_token))
    assert Settings.from_env({}).mcp_token is None


class _AskedSession:
    """A session whose client, named ``alice``, accepts every question it is asked."""

    def __init__(self) -> None:
        self.client_params = types.InitializeRequestParams(
            protocol_version="2025-06-18",
            capabilities=types.ClientCapabilities(),
            client_info=types.Implementation(name=" alice ", version="1"),
        )
        self.asked: list[str] = []

    async def elicit_form(self, message: str, schema: Any, **kwargs: Any) -> types.ElicitResult:
        self.asked.append(message)
        return types.ElicitResult(action="accept", content={"reason": "fine"})


class _Decisions:
    """A client double that records the decisions it is asked to write."""

    def __init__(self) -> None:
        self.approved: list[tuple[str, dict[str, Any]]] = []

    @property
    def approvals(self) -> _Decisions:  # the Approver writes through client.approvals
        return self

    def approve(self, request_id: str, *, channel: str | None = None, **kwargs: Any) -> None:
        assert channel == "mcp"
        self.approved.append((request_id, kwargs))


def test_an_accepted_question_approves_the_digest_of_what_it_showed_by_the_client_name(
    table: ToolTable,
) -> None:
    from cleveragents.mcp.approval_prompt import Approver
    from cleveragents.pipeline.binding import content_digest
    from cleveragents.runtime.request import SkillInvocationRequest

    route = table.route("local_notes__local_write-note")
    assert route is not None
    shown = {"title": "t", "body": "b"}
    request = SkillInvocationRequest(skill=route.skill, tool=route.tool, arguments=shown)
    context = _Context()
    session = _AskedSession()
    context.session = cast(Any, session)
    cast(Any, context).request_id = 7
    decisions = _Decisions()

    approver = Approver(cast(Any, context), cast(SkillClient, decisions), route, request)
    anyio.run(approver.ask)

    (question,) = session.asked
    assert '"title": "t"' in question
    assert decisions.approved == [
        (
            request.request_id,
            {
                "digest": content_digest(
                    {"skill": route.skill, "tool": route.tool, "arguments": shown}
                ),
                "by": "mcp-client:alice",
                "reason": "fine",
            },
        )
    ]
    assert approver.failed is False


def _session(capabilities: dict[str, Any] | None, version: str, back_channel: bool) -> Any:
    """A stand-in for the SDK's ``ServerSession``: what ``why_not_asked`` reads of it."""
    declared = (
        None if capabilities is None else types.ClientCapabilities.model_validate(capabilities)
    )
    return SimpleNamespace(
        client_capabilities=declared, protocol_version=version, can_send_request=back_channel
    )


def test_why_a_client_is_not_asked_is_said_for_each_case() -> None:
    # Given Pydantic AI's declaration (2026-07-28, clientCapabilities in each request's _meta,
    # which the SDK records as the session's capabilities)
    modern = _session({"elicitation": {"form": {}, "url": {}}}, "2026-07-28", False)
    # Then without the operator's opt-in, that is the reason, whatever the client declared
    assert "--approve-over-mcp" in (why_not_asked(modern, approve_over_mcp=False) or "")
    # ... and with it, the capability is recognised and it is asked (in an input_required
    # result, which needs no channel back to the client)
    assert why_not_asked(modern, approve_over_mcp=True) is None
    assert asks_in_result(modern)
    modern_none = _session({}, "2026-07-28", False)
    assert "did not declare" in (why_not_asked(modern_none, approve_over_mcp=True) or "")
    handshake = _session({"elicitation": {}}, "2025-11-25", True)
    assert why_not_asked(handshake, approve_over_mcp=True) is None
    assert not asks_in_result(handshake)
    none = why_not_asked(_session(None, "2025-11-25", True), approve_over_mcp=True)
    assert none == "the client did not declare the elicitation capability"
    url_only = _session({"elicitation": {"url": {}}}, "2025-11-25", True)
    assert "URL-mode" in (why_not_asked(url_only, approve_over_mcp=True) or "")
    no_channel = _session({"elicitation": {"form": {}}}, "2025-11-25", False)
    assert "no channel back" in (why_not_asked(no_channel, approve_over_mcp=True) or "")


def test_the_result_tool_says_each_state_and_never_to_retry() -> None:
    ran = SkillResult(skill_name="s/k", tool_name="s/t", success=True, output_data={"n": 1})
    done = outcome_of("r-1", ran, "SUCCESS")
    assert done.is_error is not True
    assert done.structured_content is not None
    assert done.structured_content["state"] == "succeeded"
    assert done.structured_content["result"]["output_data"] == {"n": 1}
    for state, named in [
        ("AWAITING_APPROVAL", "awaiting_approval"),
        ("STARTED", "running"),
        ("REVOKED", "revoked"),
        ("PENDING", "unknown"),
    ]:
        answer = outcome_of("r-2", None, state).structured_content
        assert answer is not None
        assert (answer["state"], answer["retry"]) == (named, False), answer
    assert bad_lookup({"request_id": "r-3"}) is None
    assert bad_lookup({}) is not None
    assert bad_lookup({"request_id": 3}) is not None


@asynccontextmanager
async def _connected(server: Any) -> AsyncIterator[ClientSession]:
    """A client session on ``server`` run in this process, over memory streams."""
    async with (
        create_client_server_memory_streams() as (client, served),
        anyio.create_task_group() as running,
    ):
        running.start_soon(
            lambda: server.run(served[0], served[1], server.create_initialization_options())
        )
        async with ClientSession(client[0], client[1]) as session:
            yield session
        running.cancel_scope.cancel()


async def _protocol_versions(server: Any) -> tuple[list[str], list[str]]:
    """What the server answers ``initialize`` at each handshake revision, then ``discover``."""
    agreed: list[str] = []
    for version in HANDSHAKE_PROTOCOL_VERSIONS:
        async with _connected(server) as session:
            asked = types.InitializeRequest(
                params=types.InitializeRequestParams(
                    protocol_version=version,
                    capabilities=types.ClientCapabilities(),
                    client_info=types.Implementation(name="raw", version="0"),
                )
            )
            answer = await session.send_request(asked, types.InitializeResult)
            agreed.append(answer.protocol_version)
    async with _connected(server) as session:
        discovered = (await session.discover()).supported_versions
    return agreed, discovered


def test_the_server_speaks_every_revision_current_clients_speak(table: ToolTable) -> None:
    server = build_server(FleetTools(table, cast(SkillClient, _NoQueue())))

    agreed, discovered = anyio.run(_protocol_versions, server)

    # initialize up to 2025-11-25, each at its own revision; server/discover for 2026-07-28
    assert agreed == list(HANDSHAKE_PROTOCOL_VERSIONS)
    assert "2024-11-05" in agreed
    assert "2025-11-25" in agreed
    assert "2026-07-28" in discovered
