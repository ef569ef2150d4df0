"""`cleveragents skills import --from-mcp`: a skill file from a real SDK server's `tools/list`.

The output is checked as YAML data, then loaded into a Catalogue and called: its
`source: mcp` tools run against the same server, remote writes gated from the first run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from mcp import types

from cleveragents.cli.app import main
from cleveragents.mcp.importer import RemoteServer, skill_document, tool_access
from cleveragents.runtime import invoke
from cleveragents.runtime.kinds.mcp_sessions import close_sessions
from cleveragents.skills import Catalogue, SkillErrorType
from cleveragents.skills.model import NAME_PATTERN
from tests.fixtures.mcp_server import build_server
from tests.support.procs import REPO, free_port, kill_group, wait_until

FIXTURE = ["python", "-m", "tests.fixtures.mcp_server"]
#: What each fixture tool's annotations must become.
ACCESS = {
    "lookup": {"writes": False, "side_effects": False, "idempotent": True},
    "append_note": {"writes": True, "side_effects": False, "idempotent": False},
    "web_search": {"writes": False, "side_effects": True, "idempotent": False},
    "fail": {"writes": False, "side_effects": False, "idempotent": False},
    "sleep": {"writes": False, "side_effects": False, "idempotent": False},
    "exit_server": {"writes": True, "side_effects": False, "idempotent": False},
    "whoami": {"writes": False, "side_effects": False, "idempotent": True},
}


def run_cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`cleveragents ARGS` from the repository root, with this interpreter first on PATH."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return subprocess.run(
        [str(Path(sys.executable).with_name("cleveragents")), *args],
        cwd=REPO, env={**os.environ, "PATH": path, "PYTHONPATH": str(REPO), **env},
        capture_output=True, text=True, timeout=120,
    )


def fixture_tools() -> dict[str, types.Tool]:
    """The fixture server's tools, as its `tools/list` gives them (in process)."""

    async def listing() -> list[types.Tool]:
        return await build_server().list_tools()

    return {tool.name: tool for tool in anyio.run(listing)}


@pytest.fixture(scope="module")
def imported() -> subprocess.CompletedProcess[str]:
    """`skills import --from-mcp --command python -m tests.fixtures.mcp_server --name ...`."""
    return run_cli("skills", "import", "--from-mcp", "--command", *FIXTURE, "--name", "team/remote")


def test_import_from_a_command_round_trips_annotations_and_schemas(
    imported: subprocess.CompletedProcess[str],
) -> None:
    done = imported

    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("# Imported by `cleveragents skills import --from-mcp`")
    skill = yaml.safe_load(done.stdout)
    assert skill["name"] == "team/remote"
    assert skill["version"] == "1.2.3"
    assert "cleveragents-test-remote" in skill["description"]
    remote = fixture_tools()
    assert [t["remote_tool"] for t in skill["tools"]] == list(remote)
    for tool in skill["tools"]:
        name = tool["remote_tool"]
        assert tool["name"] == f"team/{name}"
        assert re.match(NAME_PATTERN, tool["name"])
        assert tool["source"] == "mcp"
        assert tool["server"] == {"command": FIXTURE}
        assert {k: tool[k] for k in ACCESS[name]} == ACCESS[name], name
        assert tool["input_schema"] == remote[name].input_schema
        assert tool["output_schema"] == remote[name].output_schema
        assert tool["description"] == remote[name].description


def test_the_imported_skill_loads_and_its_remote_writes_are_gated_from_the_first_run(
    imported: subprocess.CompletedProcess[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "remote.yaml").write_text(imported.stdout, encoding="utf-8")
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # where the server's module is found
    notes = tmp_path / "notes.txt"
    write = {"path": str(notes), "text": "from the agent"}

    catalogue = Catalogue.from_paths(str(tmp_path))
    try:
        refused = invoke(
            {"skill": "team/remote", "tool": "team/append_note", "arguments": write}, catalogue
        )
        found = invoke(
            {"skill": "team/remote", "tool": "team/lookup", "arguments": {"key": "gamma"}},
            catalogue,
        )
    finally:
        close_sessions()

    assert catalogue.errors == []
    assert refused.error is not None
    assert refused.error.error_type == SkillErrorType.PERMISSION_DENIED
    assert not notes.exists()
    assert found.success, found.error
    assert found.output_data == {"key": "gamma", "value": 3, "found": True}


def test_a_quoted_command_gives_the_same_skill(
    imported: subprocess.CompletedProcess[str],
) -> None:
    quoted = run_cli(
        "skills", "import", "--from-mcp", "--command", " ".join(FIXTURE), "--name", "team/remote"
    )

    assert quoted.returncode == 0, quoted.stderr
    assert quoted.stdout == imported.stdout


@pytest.fixture
def http_fixture_server(tmp_path: Path) -> Iterator[str]:
    """The fixture server over streamable HTTP; its URL."""
    port = free_port()
    with (tmp_path / "server.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.fixtures.mcp_server", "--http", "--port", str(port)],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        wait_until(lambda: _listens(port), 60, "the fixture server on HTTP")
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        kill_group(proc)
        proc.wait(10)


def _listens(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_import_from_a_url_names_the_header_variables_never_their_values(
    http_fixture_server: str,
) -> None:
    done = run_cli(
        "skills", "import", "--from-mcp", "--url", http_fixture_server,
        "--header-from-env", "Authorization=REMOTE_AUTH", "--name", "team/web",
        REMOTE_AUTH="Bearer hush-hush",
    )

    assert done.returncode == 0, done.stderr
    assert "hush-hush" not in done.stdout
    skill = yaml.safe_load(done.stdout)
    servers = {str(tool["server"]) for tool in skill["tools"]}
    assert servers == {
        str({"url": http_fixture_server, "headers_from_env": {"Authorization": "REMOTE_AUTH"}})
    }
    access = {t["remote_tool"]: {k: t[k] for k in ACCESS["lookup"]} for t in skill["tools"]}
    assert access == ACCESS


def test_a_server_that_cannot_start_is_one_clear_error() -> None:
    done = run_cli(
        "skills", "import", "--from-mcp", "--command", "/no/such/mcp-server", "--name", "t/s"
    )

    assert done.returncode == 2
    assert done.stdout == ""
    assert "error: cannot list the tools of MCP server /no/such/mcp-server" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--command", "x", "--name", "t/s"], "--from-mcp"),
        (["--from-mcp", "--name", "t/s"], "exactly one of --command and --url"),
        (["--from-mcp", "--command", "x", "--url", "http://h/mcp", "--name", "t/s"], "exactly one"),
        (["--from-mcp", "--command", "x", "--name", "plain"], "must be namespaced"),
        (["--from-mcp", "--url", "http://h/mcp", "stray", "--name", "t/s"], "unexpected"),
        (["--from-mcp", "--url", "http://h/mcp", "--header-from-env", "X", "--name", "t/s"],
         "HEADER=ENV_VAR"),
    ],
)
def test_bad_usage_is_exit_2_with_one_line(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["skills", "import", *args]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1


def test_absent_hints_read_as_mcp_defaults_for_writes_but_not_for_open_world() -> None:
    assert tool_access(None) == {"writes": True, "side_effects": False, "idempotent": False}
    read_only = types.ToolAnnotations(readOnlyHint=True)
    assert tool_access(read_only)["writes"] is False
    contradictory = types.ToolAnnotations(readOnlyHint=True, destructiveHint=True)
    assert tool_access(contradictory)["writes"] is True


def test_remote_names_are_made_catalogue_names_and_clashes_get_a_digest() -> None:
    schema: dict[str, Any] = {"type": "object"}
    tools = [
        types.Tool(name=name, input_schema=schema)
        for name in ["search web", "search/web", "_hidden", "ok.name"]
    ]
    document = skill_document("org/team/skill", RemoteServer(command=("srv",)), None, tools)

    names = [tool["name"] for tool in document["tools"]]
    assert [name.rsplit("-", 1)[0] for name in names[:2]] == ["org/team/search-web"] * 2
    assert names[0] != names[1]
    assert names[2:] == ["org/team/hidden", "org/team/ok.name"]
    assert all(re.match(NAME_PATTERN, name) for name in names)
    assert document["version"] == "0.0.0"
    assert [tool["remote_tool"] for tool in document["tools"]] == [t.name for t in tools]
