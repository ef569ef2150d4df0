"""A stdio MCP server of a root worker is confined like a command tool (issue 29, attack 1):
it runs as the tool user with no supplementary groups, a private HOME and TMPDIR and the
minimal environment, cannot read the worker's environment, and nothing it starts outlives
its session.

The server is a few lines of the standard library's Python (JSON-RPC over stdio by hand),
in a folder the tool user can read, run by the system's interpreter: the tool user
(``nobody``) cannot run this checkout's venv."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cleveragents.runtime import invoke
from cleveragents.runtime.confined import tool_user_for
from cleveragents.runtime.kinds.command import KIND as COMMAND_KIND
from cleveragents.runtime.kinds.mcp_sessions import close_sessions
from cleveragents.skills import Catalogue
from tests.support.procs import wait_until

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")

SERVER = r'''
import json, os, subprocess, sys

def answer(message_id, result):
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": message_id, "result": result}) + "\n")
    sys.stdout.flush()

def probe():
    try:
        with open(f"/proc/{os.environ['WORKER_PID']}/environ", "rb") as f:
            worker_env = "read: " + str(len(f.read()))
    except OSError as exc:
        worker_env = type(exc).__name__
    child = subprocess.Popen(["sleep", "60"], start_new_session=True)
    return {"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
            "home": os.environ.get("HOME"), "tmpdir": os.environ.get("TMPDIR"),
            "env": sorted(os.environ), "worker_env": worker_env, "grandchild": child.pid}

for line in sys.stdin:
    message = json.loads(line)
    method, message_id = message.get("method"), message.get("id")
    if method == "initialize":
        answer(message_id, {"protocolVersion": message["params"]["protocolVersion"],
                            "capabilities": {"tools": {}},
                            "serverInfo": {"name": "probe", "version": "1"}})
    elif method == "tools/call" and "leak" in message["params"].get("arguments", {}):
        sys.stderr.write("failing with " + message["params"]["arguments"]["leak"] + "\n")
        sys.stderr.flush()
        os._exit(3)
    elif method == "tools/call":
        text = json.dumps(probe())
        answer(message_id, {"content": [{"type": "text", "text": text}], "isError": False})
    elif method == "tools/list":
        answer(message_id, {"tools": [{"name": "whoami", "inputSchema": {"type": "object"}}]})
    elif message_id is not None:
        answer(message_id, {})
'''


@pytest.fixture
def reachable() -> Iterator[Path]:
    """A folder the tool user can read: the server script and its skill file."""
    folder = Path(tempfile.mkdtemp(prefix="cleveragents-mcp-probe-"))
    folder.chmod(0o755)
    (folder / "probe.py").write_text(SERVER)
    (folder / "probe.py").chmod(0o644)
    skill = {
        "name": "probe/server",
        "tools": [{
            "name": "probe/whoami",
            "source": "mcp",
            "server": {"command": ["/usr/bin/python3", str(folder / "probe.py")],
                       "env": {"WORKER_PID": str(os.getpid())}},
            "remote_tool": "whoami",
        }],
    }
    (folder / "skills").mkdir(mode=0o755)
    (folder / "skills" / "probe.json").write_text(json.dumps(skill))
    yield folder
    shutil.rmtree(folder)


@pytest.fixture
def root_worker_user() -> Iterator[None]:
    """This process as a root worker sets itself up: its tools run as the default user."""
    before = (COMMAND_KIND.user, COMMAND_KIND.own_python)
    os.environ["CLEVERAGENTS_PLANTED_SECRET"] = "planted-secret-of-the-worker"
    close_sessions()
    COMMAND_KIND.run_as(tool_user_for(None))
    yield
    close_sessions()
    COMMAND_KIND.user, COMMAND_KIND.own_python = before
    del os.environ["CLEVERAGENTS_PLANTED_SECRET"]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@pytest.mark.usefixtures("root_worker_user")
def test_a_stdio_server_of_a_root_worker_runs_confined_as_the_tool_user(reachable: Path) -> None:
    nobody = tool_user_for(None)
    assert nobody is not None
    catalogue = Catalogue.from_paths(reachable / "skills")
    # When the tool is called
    result = invoke({"skill": "probe/server", "tool": "probe/whoami", "arguments": {}}, catalogue)
    assert result.success, result.error
    seen = result.output_data
    grandchild = seen["grandchild"]
    try:
        # Then the server ran as the tool user, with no supplementary groups
        assert (seen["uid"], seen["gid"]) == (nobody.uid, nobody.gid)
        assert seen["groups"] in ([], [nobody.gid])
        # with a private home and temporary folder, not the worker's
        assert seen["home"] == seen["tmpdir"]
        assert seen["home"] != os.environ.get("HOME")
        # with the minimal environment, and the worker's own closed to it
        assert "CLEVERAGENTS_PLANTED_SECRET" not in seen["env"]
        assert seen["worker_env"] == "PermissionError"
        # And what it left running dies with its session
        assert _alive(grandchild)
        close_sessions()
        wait_until(lambda: not _alive(grandchild), 10, "the server's grandchild to be killed")
        assert not Path(seen["home"]).exists()
    finally:
        if _alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)


@pytest.mark.usefixtures("root_worker_user")
def test_a_server_the_tool_user_cannot_run_says_who_ran_it(reachable: Path) -> None:
    (reachable / "probe.py").chmod(0o600)  # root's alone now
    unreadable = stat.S_IMODE((reachable / "probe.py").stat().st_mode)
    assert unreadable == 0o600
    catalogue = Catalogue.from_paths(reachable / "skills")
    result = invoke({"skill": "probe/server", "tool": "probe/whoami", "arguments": {}}, catalogue)
    assert result.error is not None
    assert "Permission denied" in result.error.details["stderr_tail"]


def test_a_servers_stderr_keeps_no_argument_value(reachable: Path) -> None:
    # Given a server that repeats its argument on stderr, then dies mid-call
    close_sessions()
    catalogue = Catalogue.from_paths(reachable / "skills")
    request = {"skill": "probe/server", "tool": "probe/whoami",
               "arguments": {"leak": "hunter2-secret"}}
    try:
        result = invoke(request, catalogue)
    finally:
        close_sessions()
    # Then its stderr is kept, the argument blanked as a command tool's is
    assert result.error is not None
    assert "failing with [redacted]" in result.error.details["stderr_tail"]
    assert "hunter2" not in str(result.error)
