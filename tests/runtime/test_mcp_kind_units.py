"""The ``mcp`` tool kind in process: its checks, its outputs, and the life of its sessions.

The remote is the fixture MCP server (tests/fixtures/mcp_server.py), over stdio or
streamable HTTP; calls go through ``invoke`` in this process, whose sessions are
closed after every test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import types
from pydantic import ValidationError

from cleveragents.errors import ToolExecutionError
from cleveragents.runtime import invoke
from cleveragents.runtime.kinds.mcp import output_of
from cleveragents.runtime.kinds.mcp_sessions import _StderrFile, close_sessions, sessions
from cleveragents.skills import Catalogue, Skill, SkillErrorType, SkillResult, ToolSpec
from tests.support.mcp_remote import FIXTURE_COMMAND, remote_http_server
from tests.support.procs import REPO, free_port, wait_until

pytestmark = pytest.mark.timeout(120)

STDIO = {"command": FIXTURE_COMMAND}


@pytest.fixture(autouse=True)
def _fresh_sessions() -> Iterator[None]:
    yield
    close_sessions()


def mcp_tool(name: str = "lookup", server: Any = None, **fields: Any) -> ToolSpec:
    """A ``source: mcp`` tool named ``remote/<name>`` for the remote tool ``name``."""
    fields.setdefault("remote_tool", name)
    return ToolSpec(
        name=f"remote/{name}", source="mcp", server=STDIO if server is None else server, **fields
    )


def call(tool: ToolSpec, arguments: dict[str, Any] | None = None, **kw: Any) -> SkillResult:
    """Invoke ``tool`` in this process (skill ``remote/units``)."""
    catalogue = Catalogue.from_skills([Skill(name="remote/units", tools=[tool])])
    request = {"skill": "remote/units", "tool": tool.name, "arguments": arguments or {}, **kw}
    return invoke(request, catalogue)


def pid_of(tool: ToolSpec) -> int:
    """The PID of the server behind a ``whoami`` tool."""
    result = call(tool)
    assert result.success, result.error
    return int(result.output_data["pid"])


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie does not count)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().split(") ", 1)[1][0] != "Z"


# --- the spec ---------------------------------------------------------------


def test_a_skill_file_writes_server_and_remote_tool_beside_the_common_fields() -> None:
    tool = mcp_tool("lookup", server={"url": "https://h/mcp", "headers_from_env": {"X-Key": "K"}})

    assert tool.options == {
        "server": {"url": "https://h/mcp", "headers_from_env": {"X-Key": "K"}},
        "remote_tool": "lookup",
    }


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"server": None}, "needs server"),
        ({"server": {"command": ["x"], "url": "http://h/mcp"}}, "exactly one of command"),
        ({"server": {"env": {}}}, "exactly one of command"),
        ({"server": {"command": []}}, "server.command must be a non-empty list"),
        ({"server": {"command": "python -m srv"}}, "server.command must be a non-empty list"),
        ({"server": {"url": "ftp://h/mcp"}}, "http:// or https:// URL"),
        ({"server": {"command": ["x"], "env": {"LEVEL": 3}}}, "server.env maps variable names"),
        ({"server": {"command": ["x"], "env": {"BAD NAME": "1"}}}, "server.env maps"),
        ({"server": {"url": "http://h/mcp", "headers_from_env": {"Bad Header": "V"}}},
         "maps header names"),
        ({"server": {"url": "http://h/mcp", "headers_from_env": {"X-Key": "not a var"}}},
         "values are environment variable names"),
        ({"server": {"command": ["x"], "cwd": "/tmp"}}, "server does not take cwd"),
        ({"server": {"url": "http://h/mcp", "env": {}}}, "server does not take env"),
        ({"server": {"url": "http://h/mcp"}, "pass_env": ["TOKEN"]}, "pass_env is for stdio"),
        ({"remote_tool": ""}, "needs remote_tool"),
        ({"entrypoint": "m:f"}, "must not set entrypoint or command"),
    ],
)
def test_the_kind_refuses_a_spec_it_cannot_run(fields: dict[str, Any], message: str) -> None:
    spec: dict[str, Any] = {"server": STDIO, "remote_tool": "lookup", **fields}
    if spec["server"] is None:
        del spec["server"]

    with pytest.raises(ValidationError, match=message):
        ToolSpec(name="remote/bad", source="mcp", **spec)


# --- outputs ----------------------------------------------------------------


def _text(*texts: str, is_error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=t) for t in texts], is_error=is_error
    )


def test_structured_content_then_a_json_text_block_then_text_become_the_output() -> None:
    tool = mcp_tool()
    structured = types.CallToolResult(
        content=[types.TextContent(type="text", text="ignored")], structured_content={"a": 1}
    )
    image = types.ImageContent(type="image", data="AAAA", mime_type="image/png")

    assert output_of(tool, structured) == {"a": 1}
    assert output_of(tool, _text('{"b": [1, 2]}')) == {"b": [1, 2]}
    assert output_of(tool, _text("plain words")) == "plain words"
    assert output_of(tool, _text("{}", "two blocks")) == "{}\ntwo blocks"
    assert output_of(tool, types.CallToolResult(content=[image])) == [
        {"type": "image", "data": "AAAA", "mimeType": "image/png"}
    ]


def test_an_is_error_answer_is_an_execution_error_carrying_the_remote_text() -> None:
    with pytest.raises(ToolExecutionError, match="answered with an error: disk full") as raised:
        output_of(mcp_tool(), _text("disk full", is_error=True))

    assert raised.value.details == {"remote_tool": "lookup", "remote_error": "disk full"}


# --- sessions ---------------------------------------------------------------


def test_a_header_variable_the_worker_lacks_is_an_activation_failure_naming_only_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("REMOTE_TOKEN_FOR_TEST", raising=False)
    headers = {"Authorization": "REMOTE_TOKEN_FOR_TEST"}
    tool = mcp_tool(server={"url": "http://127.0.0.1:9/mcp", "headers_from_env": headers})

    result = call(tool, {"key": "alpha"})

    assert result.error is not None
    assert result.error.error_type == SkillErrorType.TOOL_ACTIVATION_FAILURE
    assert "REMOTE_TOKEN_FOR_TEST" in result.error.message


def test_a_server_that_dies_at_start_is_an_activation_failure_with_its_stderr() -> None:
    tool = mcp_tool(server={"command": ["python", "-m", "tests.fixtures.no_such_server"]})

    result = call(tool, {"key": "alpha"})

    assert result.error is not None
    assert result.error.error_type == SkillErrorType.TOOL_ACTIVATION_FAILURE
    assert "No module named tests.fixtures.no_such_server" in result.error.details["stderr_tail"]


def test_a_server_still_starting_at_the_deadline_fails_that_call_and_serves_the_next() -> None:
    slow_start = "import time; time.sleep(1.5); from tests.fixtures.mcp_server import main; main()"
    tool = mcp_tool("whoami", server={"command": ["python", "-c", slow_start]})

    early = call(tool, timeout_s=0.3)
    later = call(tool, timeout_s=30)

    assert early.error is not None
    assert early.error.error_type == SkillErrorType.TOOL_ACTIVATION_FAILURE
    assert "did not finish starting within" in early.error.message
    assert later.success, later.error


def test_a_server_killed_while_idle_is_started_again_by_the_next_call() -> None:
    tool = mcp_tool("whoami")
    first = pid_of(tool)

    os.kill(first, signal.SIGKILL)
    wait_until(lambda: not alive(first), 10, "the server to die")
    # The session sees the end of the server's output on its own thread, and marks itself
    # dead; a call sent before that would count as sent to a server that died during it.
    wait_until(_no_live_session, 10, "the session to see its server's end")

    assert pid_of(tool) != first


def _no_live_session() -> bool:
    return not any(c.alive for c in list(sessions()._connections.values()))


CHATTY = (
    "import sys; sys.stderr.write('x' * 1_200_000 + 'first end\\n'); sys.stderr.flush(); "
    "input(); sys.stderr.write('second end\\n')"
)


def test_a_chatty_servers_stderr_file_is_cut_back_to_its_tail_while_it_runs() -> None:
    stderr = _StderrFile()
    proc = subprocess.Popen(
        [sys.executable, "-c", CHATTY], stdin=subprocess.PIPE, stderr=stderr.file
    )
    wait_until(lambda: stderr.tail().endswith("first end\n"), 30, "the first lines")

    stderr.trim()
    proc.communicate(b"\n", timeout=30)

    # The server writes at the end of the file, wherever the trim left the offset.
    assert stderr.tail().endswith("x" * 10 + "first end\nsecond end\n")
    assert os.fstat(stderr.file.fileno()).st_size < 10_000
    stderr.close()
    assert stderr.tail().endswith("second end\n")


def test_closing_the_sessions_stops_their_stdio_servers() -> None:
    server = pid_of(mcp_tool("whoami"))

    close_sessions()

    wait_until(lambda: not alive(server), 10, "the server to stop")


def test_a_session_an_http_server_forgot_when_it_restarted_is_replaced(tmp_path: Path) -> None:
    port = free_port()
    tool = mcp_tool(server={"url": f"http://127.0.0.1:{port}/mcp"})
    with remote_http_server(port, tmp_path / "first.log"):
        assert call(tool, {"key": "alpha"}).success

    with remote_http_server(port, tmp_path / "second.log"):
        again = call(tool, {"key": "beta"})

    assert again.success, again.error
    assert again.output_data == {"key": "beta", "value": 2, "found": True}


FORKS = """
import json, os
from cleveragents.runtime import invoke
from cleveragents.skills import Catalogue, Skill, ToolSpec

tool = ToolSpec(name="remote/whoami", source="mcp", remote_tool="whoami",
                server={"command": ["python", "-m", "tests.fixtures.mcp_server"]})
catalogue = Catalogue.from_skills([Skill(name="remote/units", tools=[tool])])

def server_pid():
    result = invoke({"skill": "remote/units", "tool": "remote/whoami"}, catalogue)
    assert result.success, result.error
    return result.output_data["pid"]

parent = server_pid()
read, write = os.pipe()
child = os.fork()
if child == 0:  # like a Celery pool process: forked from a process that had a session
    try:
        os.write(write, str(server_pid()).encode())
    finally:
        os._exit(0)
os.close(write)
in_child = int(os.read(read, 64))
os.waitpid(child, 0)
print(json.dumps({"parent": parent, "child": in_child, "parent_again": server_pid()}))
"""


def test_a_forked_child_starts_its_own_server_and_leaves_its_parents_alone() -> None:
    done = subprocess.run(
        [sys.executable, "-c", FORKS], cwd=REPO, capture_output=True, text=True, timeout=90,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )

    assert done.returncode == 0, done.stderr
    pids = json.loads(done.stdout)
    assert pids["child"] != pids["parent"]
    assert pids["parent_again"] == pids["parent"]
