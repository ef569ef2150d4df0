"""An MCP server's answer is bounded by the output limit in the transport itself (issue 29, 4).

Past ``CLEVERAGENTS_MAX_OUTPUT_BYTES`` (here 200,000 bytes) a call ends as
``output_too_large`` at once, over stdio and over HTTP, and the session is started
again for the next call; error texts are cut to a short excerpt; and no stored
result of any tool kind passes the limit plus a small envelope. The remotes are the
hostile servers of tests/support/mcp_hostile.py; in-process calls go through
``invoke``, and the last tests through a real worker and its Redis.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from mcp.types import PARSE_ERROR

from cleveragents.client import SkillClient
from cleveragents.runtime import invoke
from cleveragents.runtime.kinds.mcp_bounds import Meter, OverLimit, on_the_wire
from cleveragents.runtime.kinds.mcp_sessions import close_sessions, sessions
from cleveragents.runtime.outcomes import failed_with
from cleveragents.runtime.output_limit import default_output_limit, set_default_output_limit
from cleveragents.settings import Settings
from cleveragents.skills import (
    Catalogue,
    Skill,
    SkillError,
    SkillErrorType,
    SkillResult,
    ToolSpec,
)
from tests.support.mcp_hostile import STDIO_SERVER, HttpRemote, hostile_http_server
from tests.support.procs import Worker, process_alive, wait_until

pytestmark = pytest.mark.timeout(120)

#: The output limit of these tests.
LIMIT = 200_000
#: What a stored failure may add to the limit: names, message, details, Celery's fields.
ENVELOPE = 20_000
#: The interpreter that runs the stdio server: the system's, which the tool user can run.
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
#: This module's Redis database (the per-test `redis_url` fixture flushes database 0).
BOUNDS_DB = 9
EXTERNAL_REDIS = bool(os.environ.get("CLEVERAGENTS_TEST_REDIS_URL"))
#: "At once": far from any call's timeout, with room for a loaded machine.
AT_ONCE_S = 5.0


@pytest.fixture(scope="module")
def reachable() -> Iterator[Path]:
    """A folder every user can read: the stdio server, and (for the worker) the skills."""
    folder = Path(tempfile.mkdtemp(prefix="cleveragents-mcp-bounds-"))
    folder.chmod(0o755)
    (folder / "hostile.py").write_text(STDIO_SERVER)
    (folder / "hostile.py").chmod(0o644)
    yield folder
    shutil.rmtree(folder)


@pytest.fixture(autouse=True)
def _fresh_sessions() -> Iterator[None]:
    yield
    close_sessions()


def _stdio(reachable: Path, **env: str) -> dict[str, Any]:
    server: dict[str, Any] = {"command": [PYTHON, str(reachable / "hostile.py")]}
    if env:
        server["env"] = env
    return server


def _tool(name: str, server: dict[str, Any]) -> ToolSpec:
    return ToolSpec(name=f"remote/{name}", source="mcp", server=server, remote_tool=name)


def _call(tool: ToolSpec, arguments: dict[str, Any] | None = None, **kw: Any) -> SkillResult:
    """Invoke ``tool`` in this process with the output limit ``LIMIT``."""
    catalogue = Catalogue.from_skills([Skill(name="remote/bounds", tools=[tool])])
    request = {"skill": "remote/bounds", "tool": tool.name, "arguments": arguments or {}, **kw}
    return invoke(request, catalogue, max_output_bytes=LIMIT)


def _timed(tool: ToolSpec, arguments: dict[str, Any] | None = None) -> tuple[SkillResult, float]:
    started = time.monotonic()
    result = _call(tool, arguments, timeout_s=10)
    return result, time.monotonic() - started


def _too_large(result: SkillResult) -> None:
    assert result.error is not None, result
    assert result.error.error_type == SkillErrorType.TOOL_EXECUTION_FAILURE, result.error
    assert result.error.details.get("reason") == "output_too_large", result.error
    assert result.error.details["limit_bytes"] == LIMIT


def _pid(tool: ToolSpec) -> int:
    result = _call(tool)
    assert result.success, result.error
    return int(result.output_data["pid"])


def _no_live_session() -> bool:
    return not any(c.alive for c in list(sessions()._connections.values()))


# --- the meter ---------------------------------------------------------------------------------


def test_the_meter_trips_once_for_the_calls_past_their_limit_or_one_message_too_large() -> None:
    trips: list[int] = []
    meter = Meter(lambda: trips.append(1))
    # A call may be sent its output twice over (structured and as text), and framing
    small_wire = on_the_wire(100)
    assert small_wire == 2 * 100 + 65_536
    with meter.call(100) as small, meter.call(100_000) as large:
        meter.add(small_wire - 10, 100)
        with pytest.raises(OverLimit):
            meter.add(20, 100)  # past the small one's allowance only
        with pytest.raises(OverLimit):
            meter.add(1, 1)  # tripped once, for good
    assert (meter.over(small), meter.over(large), trips) == (True, False, [1])

    idle = Meter(lambda: trips.append(2))
    idle.add(LIMIT, LIMIT)  # no call waits: one message up to the default allowance passes
    most = on_the_wire(default_output_limit())
    with pytest.raises(OverLimit):
        idle.add(most, most + 1)
    assert trips == [1, 2]


# --- stdio ------------------------------------------------------------------------------------


def test_an_endless_answer_over_stdio_ends_as_output_too_large_at_once_and_the_server_is_replaced(
    reachable: Path,
) -> None:
    # Given a server that has answered once
    server = _stdio(reachable)
    before = _pid(_tool("whoami", server))

    # When a tool of it answers with one line that never ends
    result, elapsed = _timed(_tool("endless", server))

    # Then the call ends as soon as the answer passes the limit, not at its timeout
    _too_large(result)
    assert elapsed < AT_ONCE_S
    # and the server was stopped: the next call starts it again
    wait_until(lambda: not process_alive(before), 10, "the flooding server to be stopped")
    assert _pid(_tool("whoami", server)) != before


def test_an_answer_under_the_limit_is_kept_and_one_over_it_is_refused(reachable: Path) -> None:
    server = _stdio(reachable)

    fits = _call(_tool("sized", server), {"size": LIMIT // 2})
    too_big = _call(_tool("sized", server), {"size": LIMIT + 1})

    assert fits.success, fits.error
    assert fits.output_data == "x" * (LIMIT // 2)
    _too_large(too_big)


def test_notifications_past_the_limit_during_a_call_end_it_as_output_too_large(
    reachable: Path,
) -> None:
    # Given a tool that logs 600 KB before its short answer: each message is small
    result, elapsed = _timed(_tool("chatty", _stdio(reachable)), {"count": 60, "size": 10_000})

    # Then what the server sent during the call counts, and passes the limit
    _too_large(result)
    assert elapsed < AT_ONCE_S


def test_a_server_flooding_while_no_call_waits_is_stopped_and_the_next_call_starts_it_again(
    reachable: Path,
) -> None:
    # Given a process whose output limit is LIMIT, and a server that answers, then floods
    before_limit = default_output_limit()
    set_default_output_limit(LIMIT)
    try:
        server = _stdio(reachable)
        flooding = _pid(_tool("then_flood", server))

        # Then the flood is cut off at the limit: the server is stopped, its session ended
        wait_until(lambda: not process_alive(flooding), 10, "the flooding server to be stopped")
        wait_until(_no_live_session, 10, "the session to end")
        # and the next call starts a new one
        assert _pid(_tool("whoami", server)) != flooding
    finally:
        set_default_output_limit(before_limit)


@pytest.mark.parametrize(
    ("tool", "arguments", "env"),
    [
        ("error_text", {"size": LIMIT // 2}, {}),
        ("rpc_error", {"size": LIMIT // 2}, {}),
        # 5,000 blocks that fail a dozen checks each: a 60,000-line validation error
        ("invalid", {"count": 5_000}, {}),
        # an initialize answered with a JSON-RPC error of 100,000 characters
        ("whoami", {}, {"REFUSE_START": str(LIMIT // 2)}),
    ],
)
def test_an_error_text_is_cut_to_a_short_excerpt(
    reachable: Path, tool: str, arguments: dict[str, Any], env: dict[str, str]
) -> None:
    result = _call(_tool(tool, _stdio(reachable, **env)), arguments)

    assert result.error is not None
    assert len(result.error.message) < 1_000, result.error.message[:2_000]
    assert len(result.model_dump_json()) < 5_000


# --- streamable HTTP ----------------------------------------------------------------------------


@pytest.fixture
def remote() -> Iterator[HttpRemote]:
    with hostile_http_server() as server:
        yield server
        close_sessions()  # while the server still answers the session's DELETE


@pytest.mark.parametrize("tool", ["endless", "sse_endless"])
def test_an_endless_answer_over_http_ends_as_output_too_large_at_once_and_the_session_is_replaced(
    remote: HttpRemote, tool: str
) -> None:
    server = {"url": remote.url}
    assert _call(_tool("whoami", server)).success

    result, elapsed = _timed(_tool(tool, server))

    _too_large(result)
    assert elapsed < AT_ONCE_S
    # The client stopped reading: the server's writes failed
    wait_until(lambda: tool in remote.cut_off, 10, "the server to see the answer cut off")
    # and the next call is served by a new session
    again = _call(_tool("whoami", server))
    assert again.success, again.error
    assert again.output_data == {"sessions": 2}


def test_an_event_stream_answer_under_the_limit_is_kept(remote: HttpRemote) -> None:
    # 1.5 MB in one event, under the default limit (10 MB): the SDK alone stops at 1 MiB
    tool = _tool("sse_sized", {"url": remote.url})
    catalogue = Catalogue.from_skills([Skill(name="remote/bounds", tools=[tool])])
    request = {"skill": "remote/bounds", "tool": tool.name, "arguments": {"size": 1_500_000}}

    result = invoke(request, catalogue)

    assert result.success, result.error
    assert result.output_data == "x" * 1_500_000


def test_a_compressed_answer_is_never_expanded(remote: HttpRemote) -> None:
    # Given a server that gzips 200 MB of answer into about 200 KB, unasked
    result, elapsed = _timed(_tool("gzip_bomb", {"url": remote.url}), {"size": 200_000_000})

    # Then the answer is read as sent, within the limit, and is no JSON: a quick parse error
    # (expanded, it was 200 MB in memory, then output_too_large)
    assert result.error is not None
    assert result.error.error_type == SkillErrorType.TOOL_EXECUTION_FAILURE
    assert result.error.details.get("mcp_error_code") == PARSE_ERROR, result.error
    assert elapsed < AT_ONCE_S
    assert len(result.model_dump_json()) < 5_000


def test_a_failure_keeps_a_short_message_and_short_details_whatever_a_tool_raised() -> None:
    raised = SkillError(
        error_type=SkillErrorType.TOOL_EXECUTION_FAILURE,
        message="m" * 1_000_000,
        details={"reason": "r", "said": "s" * 1_000_000, "rows": list(range(100_000))},
        skill_name="remote/bounds",
        tool_name="remote/loud",
    )

    result = failed_with(raised, "remote/bounds", "remote/loud")

    assert result.error is not None
    assert len(result.model_dump_json()) < ENVELOPE
    assert result.error.message.startswith("m" * 10_000)
    assert result.error.message.endswith("... (990,000 more chars)")
    assert result.error.details["reason"] == "r"
    assert result.error.details["said"].startswith("s" * 1_000)
    assert "rows" not in result.error.details
    assert result.error.details["details_cut"] == 1


# --- what is stored, through a real worker --------------------------------------------------------

PYTHON_TOOLS = '''
def shout(size: int) -> None:
    """Fail with a message of ``size`` characters."""
    raise ValueError("x" * size)
'''


@dataclass(frozen=True)
class Fleet:
    """A worker with the output limit LIMIT, a producer, and its Redis."""

    client: SkillClient
    broker: str

    def stored(self, tool: str, arguments: dict[str, Any]) -> tuple[SkillResult, int, float]:
        """Run ``bounds/<tool>``: its result, the bytes Redis holds for it, the seconds taken."""
        request_id = f"bounds-{uuid.uuid4()}"
        started = time.monotonic()
        handle = self.client.submit(
            "bounds/all", f"bounds/{tool}", arguments, request_id=request_id, timeout_s=30
        )
        result = handle.result(timeout=90)
        elapsed = time.monotonic() - started
        with redis.Redis.from_url(self.broker) as store:
            return result, int(store.strlen(f"celery-task-meta-{request_id}")), elapsed


def _worker_skills(folder: Path) -> Path:
    skills = folder / "skills"
    skills.mkdir(mode=0o755, exist_ok=True)
    server = _stdio(folder)
    tools: list[dict[str, Any]] = [
        {"name": f"bounds/{name}", "source": "mcp", "server": server, "remote_tool": name}
        for name in ("whoami", "endless", "error_text", "sized")
    ]
    tools.append({"name": "bounds/shout", "source": "python", "entrypoint": "bound_tools:shout"})
    (skills / "bounds.json").write_text(json.dumps({"name": "bounds/all", "tools": tools}))
    (skills / "bound_tools.py").write_text(PYTHON_TOOLS)
    return skills


@pytest.fixture(scope="module")
def fleet(session_redis_url: str, reachable: Path) -> Iterator[Fleet]:
    broker = session_redis_url
    if not EXTERNAL_REDIS:
        broker = session_redis_url.rsplit("/", 1)[0] + f"/{BOUNDS_DB}"
    redis.Redis.from_url(broker).flushdb()
    env = {
        "CLEVERAGENTS_BROKER_URL": broker,
        "CLEVERAGENTS_RESULT_BACKEND": broker,
        "CLEVERAGENTS_CATALOGUE": str(_worker_skills(reachable)),
        "CLEVERAGENTS_READ_ONLY": "0",
        "CLEVERAGENTS_MAX_OUTPUT_BYTES": str(LIMIT),
    }
    worker = Worker(env, concurrency=1).start()
    client = SkillClient(settings=Settings.from_env({"CLEVERAGENTS_BROKER_URL": broker}))
    try:
        yield Fleet(client, broker)
    finally:
        client.close()
        worker.stop()


@pytest.mark.parametrize(
    ("tool", "arguments", "reason"),
    [
        # 300 MB once kept a pool process busy past its timeout
        ("endless", {}, "output_too_large"),
        # 30 MB of isError text was read whole (and once stored twice)
        ("error_text", {"size": 30_000_000}, "output_too_large"),
        # a python tool's 1 MB exception message
        ("shout", {"size": 1_000_000}, None),
    ],
)
def test_no_stored_result_of_any_tool_kind_passes_the_limit_plus_a_small_envelope(
    fleet: Fleet, tool: str, arguments: dict[str, Any], reason: str | None
) -> None:
    result, stored, elapsed = fleet.stored(tool, arguments)

    assert result.error is not None
    assert result.error.details.get("reason") == reason, result.error.message[:500]
    assert 0 < stored < LIMIT + ENVELOPE
    assert elapsed < 15  # the timeout is 30 s
    # and the worker still serves the next call
    after, _, _ = fleet.stored("whoami", {})
    assert after.success, after.error


def test_an_answer_just_under_the_limit_is_stored_whole(fleet: Fleet) -> None:
    result, stored, _ = fleet.stored("sized", {"size": LIMIT - 1_000})

    assert result.success, result.error
    assert result.output_data == "x" * (LIMIT - 1_000)
    assert stored < LIMIT + ENVELOPE
