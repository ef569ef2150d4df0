"""Sandboxed tools (issue 45): tests that would catch a leak, with real processes.

Each test runs a tool the way a worker does (``invoke`` in this process, the
command kind as a root worker sets it up: as ``nobody`` when this is root), once
sandboxed and, where it shows the test can fail, once not. The tool is a script
of the standard library in a folder the tool user can read, run by the system's
interpreter (``nobody`` cannot run this checkout's venv).
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from cleveragents.mcp.importer import RemoteServer, import_skill
from cleveragents.runtime import invoke
from cleveragents.runtime.confined import tool_user_for
from cleveragents.runtime.kinds.command import KIND as COMMAND_KIND
from cleveragents.runtime.kinds.mcp_sessions import close_sessions
from cleveragents.runtime.sandbox import SANDBOX_UNAVAILABLE, Sandboxing
from cleveragents.settings import Settings
from cleveragents.skills import Catalogue, SkillErrorType, SkillResult, ToolSpec
from tests.fixtures.catalogues import request, single
from tests.support.procs import REPO, process_alive, wait_until

pytestmark = [
    pytest.mark.timeout(120),
    # CI installs bubblewrap (scripts/test): there a missing one fails, never skips
    pytest.mark.skipif(
        shutil.which("bwrap") is None and os.environ.get("CI") != "true",
        reason="needs bubblewrap (scripts/test installs it: INSTALL_BWRAP=1)",
    ),
]

PROBE = r"""
import json, os, socket, sys, urllib.request

args = json.load(sys.stdin)
do = args["do"]
if do == "connect":
    try:
        socket.create_connection(("127.0.0.1", args["port"]), timeout=5).close()
        print(json.dumps("connected"))
    except OSError as exc:
        print(json.dumps(type(exc).__name__))
elif do == "write":
    done = {}
    for path in args["paths"]:
        try:
            with open(path, "w") as handle:
                handle.write("x")
            done[path] = "written"
        except OSError as exc:
            done[path] = exc.strerror
    print(json.dumps(done))
elif do == "read":
    done = {}
    for path in args["paths"]:
        try:
            done[path] = sorted(os.listdir(path)) if os.path.isdir(path) else open(path).read()
        except OSError as exc:
            done[path] = exc.strerror
    print(json.dumps(done))
elif do == "fetch":
    done = {}
    for url in args["urls"]:
        try:
            done[url] = urllib.request.urlopen(url, timeout=10).read().decode()
        except urllib.error.HTTPError as exc:
            done[url] = exc.code
        except OSError as exc:
            done[url] = type(exc).__name__
    print(json.dumps(done))
elif do == "connect_through":
    proxy = os.environ["HTTPS_PROXY"].rsplit(":", 1)
    with socket.create_connection((proxy[0].split("//")[1], int(proxy[1])), timeout=10) as s:
        s.sendall(f"CONNECT localhost:{args['port']} HTTP/1.1\r\n\r\n".encode())
        reply = s.recv(1024).decode()
        s.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        body = b""
        while chunk := s.recv(65536):
            body += chunk
    print(json.dumps([reply.split("\r\n")[0], body.decode().rsplit("\r\n", 1)[-1]]))
elif do == "proc":
    seen = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                seen[name] = open(f"/proc/{name}/cmdline", "rb").read().split(b"\0")[0].decode()
            except OSError:
                seen[name] = "?"
    status = open("/proc/self/status").read()
    no_new = [line.split()[1] for line in status.splitlines() if line.startswith("NoNewPrivs")]
    print(json.dumps({"processes": seen, "no_new_privs": no_new[0], "cwd": os.getcwd(),
                      "home": os.environ["HOME"], "tmpdir": os.environ["TMPDIR"]}))
elif do == "mark":
    open(args["path"], "w").write("ran")
    print(json.dumps("ran"))
elif do == "hang":
    import subprocess, time
    child = subprocess.Popen(["sleep", "60"], start_new_session=True)
    open(args["path"], "w").write(str(child.pid))
    time.sleep(60)  # the tool hangs: its time-out must end it and its child
"""


@pytest.fixture
def place() -> Iterator[Path]:
    """A folder every user may read (the probe script) and write (what tests look at)."""
    folder = Path(tempfile.mkdtemp(prefix="cleveragents-sandbox-test-"))
    folder.chmod(0o1777)
    (folder / "probe.py").write_text(PROBE)
    (folder / "probe.py").chmod(0o644)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(autouse=True)
def as_a_root_worker() -> Iterator[None]:
    """The command kind as a worker sets it up: the default tool user, sandboxes by default."""
    before = (COMMAND_KIND.user, COMMAND_KIND.own_python, COMMAND_KIND.sandboxing)
    COMMAND_KIND.run_as(tool_user_for(None))
    COMMAND_KIND.sandbox_with(Sandboxing())
    yield
    close_sessions()
    COMMAND_KIND.user, COMMAND_KIND.own_python, COMMAND_KIND.sandboxing = before


def _probe(place: Path, sandbox: Any = None, **fields: Any) -> ToolSpec:
    return ToolSpec(
        name="test/probe",
        source="command",
        command=["/usr/bin/python3", str(place / "probe.py")],
        sandbox=sandbox,
        timeout_s=fields.pop("timeout_s", 30),
        **fields,
    )


def _run(tool: ToolSpec, **arguments: Any) -> SkillResult:
    return invoke(
        request("test/probe", arguments=arguments, allow_writes=tool.writes), single(tool)
    )


def _output(tool: ToolSpec, **arguments: Any) -> Any:
    result = _run(tool, **arguments)
    assert result.success, result.error
    return result.output_data


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A TCP listener on the host's loopback."""
    server = socket.create_server(("127.0.0.1", 0))
    server.setblocking(False)
    yield server
    server.close()


def _accepted(server: socket.socket) -> bool:
    try:
        server.accept()[0].close()
    except BlockingIOError:
        return False
    return True


# --- the network ----------------------------------------------------------------------------


def test_a_listener_on_the_host_sees_no_connection_from_a_sandboxed_tool(
    place: Path, listener: socket.socket
) -> None:
    port = listener.getsockname()[1]
    # Unsandboxed, the same tool reaches the host's listener (the test can fail)
    assert _output(_probe(place), do="connect", port=port) == "connected"
    assert _accepted(listener)
    # Sandboxed: its connection goes nowhere, and the listener has seen none
    # (the tool has ended: a connection it made would be waiting to be accepted)
    assert _output(_probe(place, True), do="connect", port=port) == "ConnectionRefusedError"
    assert not _accepted(listener)


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "5")
        self.end_headers()
        self.wfile.write(b"hello")

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def web() -> Iterator[int]:
    """An HTTP server on the host's 127.0.0.1 that answers "hello"; its port."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_an_allowed_localhost_port_answers_through_the_proxy_and_another_address_is_refused(
    place: Path, web: int, caplog: pytest.LogCaptureFixture
) -> None:
    tool = _probe(place, {"network": [f"localhost:{web}"]})
    allowed = f"http://localhost:{web}/?token=argument-secret-1"
    other = f"http://127.0.0.2:{web}/?token=argument-secret-2"
    same_address_other_name = f"http://127.0.0.1:{web}/"
    with caplog.at_level(logging.WARNING, logger="cleveragents.sandbox"):
        seen = _output(tool, do="fetch", urls=[allowed, other, same_address_other_name])
    assert seen == {allowed: "hello", other: 403, same_address_other_name: 403}
    # The refusal is logged with the host and port, never the request's path or query
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert any(f"127.0.0.2:{web}" in line and "test/probe" in line for line in refusals)
    assert not any("argument-secret" in r.getMessage() for r in caplog.records)


def test_connect_tunnels_to_an_allowed_destination(place: Path, web: int) -> None:
    tool = _probe(place, {"network": [f"localhost:{web}"]})
    status, body = _output(tool, do="connect_through", port=web)
    assert status == "HTTP/1.1 200 Connection established"
    assert body == "hello"


# --- the filesystem -------------------------------------------------------------------------


def test_a_write_outside_scratch_and_allow_write_fails(place: Path) -> None:
    allowed = place / "allowed"
    allowed.mkdir(mode=0o777)
    allowed.chmod(0o777)
    outside = place / "outside.txt"
    tool = _probe(place, {"allow_write": [str(allowed)]}, writes=True)
    seen = _output(tool, do="write", paths=[str(outside), str(allowed / "in.txt"), "scratch.txt"])
    assert seen == {
        str(outside): "Read-only file system",
        str(allowed / "in.txt"): "written",
        "scratch.txt": "written",
    }
    assert not outside.exists()
    assert (allowed / "in.txt").read_text() == "x"
    # Unsandboxed, the same write lands (the test can fail)
    assert _output(_probe(place), do="write", paths=[str(outside)]) == {str(outside): "written"}


def test_a_deny_read_file_is_unreadable_while_its_world_readable_neighbour_is_not(
    place: Path,
) -> None:
    secret, neighbour, folder = place / "secret.txt", place / "neighbour.txt", place / "private"
    for path in (secret, neighbour):
        path.write_text("content")
        path.chmod(0o644)
    folder.mkdir(mode=0o755)
    (folder / "inside.txt").write_text("x")
    (folder / "inside.txt").chmod(0o644)
    tool = _probe(place, {"deny_read": [str(secret), str(folder)]})
    seen = _output(tool, do="read", paths=[str(secret), str(neighbour), str(folder)])
    assert seen == {str(secret): "Permission denied", str(neighbour): "content", str(folder): []}
    unsandboxed = _output(_probe(place), do="read", paths=[str(secret), str(folder)])
    assert unsandboxed == {str(secret): "content", str(folder): ["inside.txt"]}


# --- processes ------------------------------------------------------------------------------


def test_proc_shows_only_the_tools_own_processes(place: Path) -> None:
    seen = _output(_probe(place, True), do="proc")
    # bubblewrap's init (pid 1) and the tool: nothing of the worker or the machine
    assert len(seen["processes"]) <= 3, seen["processes"]
    assert "1" in seen["processes"]
    assert not any(str(os.getpid()) == pid for pid in seen["processes"]) or os.getpid() <= 3
    assert seen["no_new_privs"] == "1"
    # Its working folder, HOME and TMPDIR are its private scratch folder, gone once it ends
    assert seen["cwd"] == seen["home"] == seen["tmpdir"]
    assert not Path(seen["cwd"]).exists()
    assert len(_output(_probe(place), do="proc")["processes"]) > 3  # the test can fail


def test_a_sandboxed_tool_that_hangs_is_stopped_with_everything_it_started(place: Path) -> None:
    pid_file = place / "child.pid"
    tool = _probe(place, {"allow_write": [str(place)]}, timeout_s=1.0, writes=True)
    started = time.monotonic()
    result = _run(tool, do="hang", path=str(pid_file))
    assert result.error is not None
    assert result.error.details.get("reason") == "timeout", result.error
    assert time.monotonic() - started < 1.0 + 3.0
    # The pid it wrote is its sandbox's; whatever it was, no sleep of the sandbox survives
    assert pid_file.exists()
    assert not [p for p in Path("/proc").iterdir() if _is_sandboxed_sleep(p)]


def _is_sandboxed_sleep(proc: Path) -> bool:
    try:
        words = (proc / "cmdline").read_bytes().split(b"\0")
        return words[:2] == [b"sleep", b"60"] and process_alive(int(proc.name))
    except (OSError, ValueError):
        return False


# --- a worker that cannot make the sandbox --------------------------------------------------


def test_a_worker_without_bwrap_answers_sandbox_unavailable_and_never_runs_the_tool(
    place: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mark = place / "ran"
    tool = _probe(place, True)
    for sandboxing, path in (
        (Sandboxing(bwrap="/nonexistent/bwrap"), os.environ["PATH"]),
        (Sandboxing(), str(place)),  # PATH without bwrap
    ):
        monkeypatch.setenv("PATH", path)
        COMMAND_KIND.sandbox_with(sandboxing)
        result = _run(tool, do="mark", path=str(mark))
        assert result.error is not None
        assert result.error.error_type == SkillErrorType.TOOL_ACTIVATION_FAILURE
        assert result.error.details["reason"] == SANDBOX_UNAVAILABLE
        assert "bubblewrap" in result.error.details["fix"]
        assert not mark.exists()
        # One line at start names the sandboxed tools it cannot serve
        warning = sandboxing.unserved([tool, _probe(place)], COMMAND_KIND.user)
        assert warning is not None
        assert "test/probe" in warning
    monkeypatch.setenv("PATH", os.environ["PATH"])


def test_every_tool_of_a_sandboxing_worker_is_sandboxed_and_its_own_mapping_refines_it(
    place: Path, web: int
) -> None:
    settings = Settings.from_env({"CLEVERAGENTS_SANDBOX": "1", "CLEVERAGENTS_BWRAP": "bwrap"})
    COMMAND_KIND.sandbox_with(Sandboxing(every_tool=settings.sandbox, bwrap=settings.bwrap))
    assert len(_output(_probe(place), do="proc")["processes"]) <= 3
    url = f"http://localhost:{web}/"
    assert _output(_probe(place), do="fetch", urls=[url]) == {url: "URLError"}
    refined = _probe(place, {"network": [f"localhost:{web}"]})
    assert _output(refined, do="fetch", urls=[url]) == {url: "hello"}


# --- a stdio MCP server ---------------------------------------------------------------------


def test_a_sandboxed_stdio_mcp_server_is_imported_and_called_with_no_network(
    tmp_path: Path,
) -> None:
    # The fixture server needs this checkout's venv: it runs as the worker's own user
    COMMAND_KIND.run_as(None)
    # Given the fixture server's tools, imported, each asking for a sandbox with no network
    server = RemoteServer(command=(sys.executable, "-m", "tests.fixtures.mcp_server"))
    document = yaml.safe_load(import_skill("team/remote", server))
    for tool in document["tools"]:
        tool["sandbox"] = {"network": "none"}
    (tmp_path / "remote.yaml").write_text(yaml.safe_dump(document))
    catalogue = Catalogue.from_paths(tmp_path)
    assert not catalogue.errors, catalogue.errors
    lookup = next(t["name"] for t in document["tools"] if t["remote_tool"] == "lookup")
    whoami = next(t["name"] for t in document["tools"] if t["remote_tool"] == "whoami")
    # When its tools are called, they answer from inside the sandbox
    result = invoke(
        {"skill": "team/remote", "tool": lookup, "arguments": {"key": "alpha"}}, catalogue
    )
    assert result.success, result.error
    assert result.output_data["found"] is True
    seen = invoke({"skill": "team/remote", "tool": whoami, "arguments": {}}, catalogue)
    assert seen.success, seen.error
    assert seen.output_data["pid"] <= 3  # its own PID namespace: bwrap's init is 1
    assert REPO.exists()


def test_a_worker_that_cannot_make_sandboxes_says_so_once_at_start(
    redis_url: str, start_worker: Any
) -> None:
    # Given a worker where every command tool is sandboxed and bubblewrap is missing
    worker = start_worker(
        redis_url, CLEVERAGENTS_SANDBOX="1", CLEVERAGENTS_BWRAP="/nonexistent/bwrap"
    )
    # Then its log names the sandboxed tools it cannot serve, once, at start
    said = "cannot make sandboxes"
    wait_until(lambda: said in worker.log_text(), 30, "the start-up warning")
    assert worker.log_text().count(said) == 1
    assert "local/append-note" in worker.log_text()  # a command tool of the catalogue
