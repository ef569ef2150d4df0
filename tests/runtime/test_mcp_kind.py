"""``source: mcp`` tools through a real worker: the fixture MCP server as the remote.

One worker (concurrency 1, so one pool process and one session per server) serves
the whole module, off its own Redis database: the catalogue in
tests/fixtures/mcp_kind_skills (stdio) plus a skill written here for the fixture
server over streamable HTTP. The shutdown test starts a worker of its own.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from cleveragents.client import SkillClient
from cleveragents.settings import Settings
from cleveragents.skills import SkillErrorType, SkillResult
from tests.support.mcp_remote import MCP_KIND_SKILLS, remote_http_server
from tests.support.procs import Worker, free_port, wait_until

pytestmark = pytest.mark.timeout(120)

#: This module's Redis database (the per-test `redis_url` fixture flushes database 0).
KIND_DB = 8
#: Set when the tests use an existing Redis (tests/conftest.py): then its database is used.
EXTERNAL_REDIS = bool(os.environ.get("CLEVERAGENTS_TEST_REDIS_URL"))
SKILL = "remote/fixture"
#: Servers run as the worker's own user (see the fleet fixture).
ROOT_TOOL_USER = {"CLEVERAGENTS_TOOL_USER": "root"} if os.geteuid() == 0 else {}


@dataclass(frozen=True)
class Fleet:
    """The module's worker, a producer on its Redis, and the port of the HTTP remote."""

    client: SkillClient
    worker: Worker
    http_port: int

    def call(self, tool: str, arguments: dict[str, Any] | None = None, **kw: Any) -> SkillResult:
        """Submit ``remote/<tool>`` of ``skill`` and wait for its result."""
        skill = kw.pop("skill", SKILL)
        handle = self.client.submit(skill, f"remote/{tool}", arguments or {}, **kw)
        return handle.result(timeout=60)


def _http_skill(port: int) -> dict[str, Any]:
    return {
        "name": "remote/over-http",
        "tools": [
            {
                "name": "remote/lookup-http",
                "source": "mcp",
                "server": {
                    "url": f"http://127.0.0.1:{port}/mcp",
                    "headers_from_env": {"Authorization": "FIXTURE_TOKEN"},
                },
                "remote_tool": "lookup",
                "input_schema": {"type": "object", "required": ["key"]},
            }
        ],
    }


@pytest.fixture(scope="module")
def fleet(session_redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """One worker with the fixture server's tools, stdio and HTTP."""
    port = free_port()
    http_skills = tmp_path_factory.mktemp("mcp-http-skills")
    (http_skills / "http.yaml").write_text(yaml.safe_dump(_http_skill(port)), encoding="utf-8")
    broker = session_redis_url
    if not EXTERNAL_REDIS:
        broker = session_redis_url.rsplit("/", 1)[0] + f"/{KIND_DB}"
    redis.Redis.from_url(broker).flushdb()
    env = {
        "CLEVERAGENTS_BROKER_URL": broker,
        "CLEVERAGENTS_RESULT_BACKEND": broker,
        "CLEVERAGENTS_CATALOGUE": os.pathsep.join([str(MCP_KIND_SKILLS), str(http_skills)]),
        "CLEVERAGENTS_READ_ONLY": "0",
        "FIXTURE_TOKEN": "Bearer not-a-real-token",
        # The fixture server needs this venv's interpreter and the MCP SDK, which the tool
        # user of a root worker (nobody) cannot run from a checkout in root's home: these
        # tests are about the kind, tests/runtime/test_mcp_confinement.py about the user.
        **ROOT_TOOL_USER,
    }
    worker = Worker(env, concurrency=1).start()
    client = SkillClient(settings=Settings.from_env({"CLEVERAGENTS_BROKER_URL": broker}))
    try:
        yield Fleet(client, worker, port)
    finally:
        client.close()
        worker.stop()


def test_a_remote_read_returns_its_structured_output(fleet: Fleet) -> None:
    result = fleet.call("lookup", {"key": "beta"})

    assert result.success, result.error
    assert result.output_data == {"key": "beta", "value": 2, "found": True}


def test_arguments_the_input_schema_refuses_never_reach_the_remote(
    fleet: Fleet, tmp_path: Path
) -> None:
    notes = tmp_path / "notes.txt"

    result = fleet.call("append-note", {"path": str(notes), "text": 5}, allow_writes=True)

    assert result.error is not None
    assert result.error.error_type == SkillErrorType.VALIDATION_ERROR
    assert not notes.exists()


def test_a_remote_error_is_a_tool_execution_failure_with_the_remote_text_arguments_blanked(
    fleet: Fleet,
) -> None:
    # The remote's text repeats its argument, which may be a secret: blanked, as for a
    # command tool's stderr (issue 29, attack 9); the rest of what it said is kept.
    result = fleet.call("fail", {"message": "the remote says no"})

    assert result.error is not None
    assert result.error.error_type == SkillErrorType.TOOL_EXECUTION_FAILURE
    assert "Error executing tool fail: [redacted]" in result.error.message
    assert "the remote says no" not in str(result.error)
    assert result.error.details["remote_tool"] == "fail"


def test_a_remote_write_is_refused_without_allow_writes_and_runs_with_it(
    fleet: Fleet, tmp_path: Path
) -> None:
    notes = tmp_path / "notes.txt"
    arguments = {"path": str(notes), "text": "hello"}

    refused = fleet.call("append-note", arguments)
    allowed = fleet.call("append-note", arguments, allow_writes=True)

    assert refused.error is not None
    assert refused.error.error_type == SkillErrorType.PERMISSION_DENIED
    assert allowed.success, allowed.error
    assert allowed.output_data == {"path": str(notes), "lines": 1}
    assert notes.read_text() == "hello\n"


def test_one_server_serves_every_call_of_a_worker_process_with_a_minimal_environment(
    fleet: Fleet,
) -> None:
    first = fleet.call("whoami")
    fleet.call("lookup", {"key": "alpha"})
    second = fleet.call("whoami")

    assert first.success, first.error
    assert second.success, second.error
    assert first.output_data["pid"] == second.output_data["pid"]
    environment = set(first.output_data["environment"])
    assert "FIXTURE_LEVEL" in environment  # the skill's server.env
    assert not {name for name in environment if name.startswith("CLEVERAGENTS_")}
    assert "FIXTURE_TOKEN" not in environment  # a worker variable nobody passed


def test_a_server_that_exits_mid_call_fails_that_call_and_the_next_call_restarts_it(
    fleet: Fleet,
) -> None:
    before = fleet.call("whoami")

    died = fleet.call("exit-server")
    after = fleet.call("whoami")

    assert died.error is not None
    assert died.error.error_type == SkillErrorType.TOOL_EXECUTION_FAILURE
    assert "went away during the call of 'exit_server'" in died.error.message
    assert after.success, after.error
    assert after.output_data["pid"] != before.output_data["pid"]


def test_a_server_that_cannot_start_is_a_tool_activation_failure(fleet: Fleet) -> None:
    result = fleet.call("missing-server", {"key": "alpha"}, skill="remote/broken")

    assert result.error is not None
    assert result.error.error_type == SkillErrorType.TOOL_ACTIVATION_FAILURE
    assert "/no/such/mcp-server" in result.error.message


def test_a_call_that_outlives_its_timeout_is_stopped_and_the_session_still_serves(
    fleet: Fleet,
) -> None:
    before = fleet.call("whoami")

    slow = fleet.call("sleep", {"seconds": 20}, timeout_s=1)
    after = fleet.call("whoami")

    assert slow.error is not None
    assert slow.error.error_type == SkillErrorType.TOOL_EXECUTION_FAILURE
    assert slow.error.details["reason"] == "timeout"
    assert slow.error.message == "tool 'remote/sleep' timed out after 1s and was stopped"
    assert slow.duration_ms < 10_000
    assert after.success, after.error
    assert after.output_data["pid"] == before.output_data["pid"]


def test_a_tool_of_a_server_over_streamable_http(fleet: Fleet, tmp_path: Path) -> None:
    with remote_http_server(fleet.http_port, tmp_path / "remote.log"):
        result = fleet.call("lookup-http", {"key": "gamma"}, skill="remote/over-http")

    assert result.success, result.error
    assert result.output_data == {"key": "gamma", "value": 3, "found": True}


def test_a_worker_that_shuts_down_stops_the_stdio_servers_of_its_processes(
    client: SkillClient, redis_url: str, start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    # Given a server that outlives the end of its stdin: once the fixture server has
    # gone, its shell writes its PID and becomes `sleep` (ending stdin alone leaves it).
    pid_file = tmp_path / "lingering.pid"
    lingering = f"python -m tests.fixtures.mcp_server; echo $$ > {pid_file}; exec sleep 60"
    skill = {
        "name": "remote/lingering",
        "tools": [
            {
                "name": "remote/whoami",
                "source": "mcp",
                "server": {"command": ["sh", "-c", lingering]},
                "remote_tool": "whoami",
            }
        ],
    }
    (tmp_path / "skills").mkdir()
    (tmp_path / "skills" / "lingering.yaml").write_text(yaml.safe_dump(skill), encoding="utf-8")
    worker = start_worker(
        redis_url, concurrency=1, CLEVERAGENTS_CATALOGUE=str(tmp_path / "skills"), **ROOT_TOOL_USER
    )
    assert client.submit("remote/lingering", "remote/whoami").result(timeout=60).success

    # When the worker shuts down warmly (SIGTERM to its main process).
    assert worker.proc is not None
    os.kill(worker.proc.pid, signal.SIGTERM)
    worker.proc.wait(30)

    # Then its pool process closed the session: the server's whole group was stopped.
    wait_until(lambda: _written(pid_file), 10, "the server's shell to outlive the server")
    shell = int(pid_file.read_text())
    try:
        wait_until(lambda: not _running(shell), 10, "the lingering shell to be stopped")
    finally:
        if _running(shell):
            os.kill(shell, signal.SIGKILL)


def _running(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _written(path: Path) -> bool:
    """Whether ``path`` holds its line yet (a file is created before it is written)."""
    return path.exists() and bool(path.read_text(encoding="utf-8").strip())
