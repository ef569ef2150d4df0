"""The ``sandbox`` field of a tool (issue 45): how it reads, and what ``skills check`` names."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cleveragents.skills import ToolSpec
from cleveragents.skills.policies import Sandbox

SKILL = """\
name: test/s
tools:
  - name: test/t
{tool}"""


def _check(tmp_path: Path, tool: str) -> dict[str, Any]:
    path = tmp_path / "s.yaml"
    path.write_text(SKILL.format(tool=tool), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "cleveragents", "skills", "check", str(path), "--json"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _problems(report: dict[str, Any]) -> list[str]:
    return [str(problem) for problem in report["problems"]]


def test_sandbox_true_is_no_network_and_nothing_writable() -> None:
    tool = ToolSpec(name="t/a", source="command", command=["true"], sandbox=True)  # type: ignore[arg-type]
    assert tool.sandbox == Sandbox(network="none", allow_write=(), deny_read=())
    none = ToolSpec(name="t/a", source="command", command=["true"], sandbox=False)  # type: ignore[arg-type]
    assert none.sandbox is None


def test_network_rules_match_names_ports_and_subdomains() -> None:
    rules = Sandbox(network=("api.example.com:443", "*.corp.test", "localhost:8080", "[::1]:9"))
    assert rules.allows("api.example.com", 443)
    assert rules.allows("API.Example.com.", 443)
    assert not rules.allows("api.example.com", 80)
    assert rules.allows("git.corp.test", 22)
    assert not rules.allows("corp.test", 22)  # *.domain: the names below it
    assert not rules.allows("evilcorp.test", 22)
    assert rules.allows("localhost", 8080)
    assert not rules.allows("127.0.0.1", 8080)  # by name, not by address
    assert rules.allows("::1", 9)
    assert not Sandbox().allows("localhost", 8080)
    assert Sandbox(network="all").allows("anything", 1)
    assert Sandbox(network=()).network == "none"


@pytest.mark.parametrize(
    "bad",
    ["network: [http://x.test]", "network: [x.test:99999]", "network: some", "allow_write: [rel]",
     "deny_read: [/]"],
)  # fmt: skip
def test_a_bad_sandbox_is_a_problem_of_its_file(tmp_path: Path, bad: str) -> None:
    report = _check(
        tmp_path,
        f"    source: command\n    command: [cat]\n    writes: true\n    sandbox: {{{bad}}}\n",
    )
    assert not report["ok"]
    assert any("sandbox" in p for p in _problems(report)), report


def test_skills_check_names_a_read_only_tool_that_allows_writes(tmp_path: Path) -> None:
    report = _check(
        tmp_path,
        "    source: command\n    command: [cat]\n    sandbox: {allow_write: [/srv/out]}\n",
    )
    assert not report["ok"]
    [problem] = _problems(report)
    assert "read-only" in problem
    assert "allow_write" in problem
    assert "test/t" in problem
    fine = _check(
        tmp_path,
        "    source: command\n    command: [cat]\n    writes: true\n"
        "    sandbox: {allow_write: [/srv/out]}\n",
    )
    assert fine["ok"], fine


def test_skills_check_names_a_python_tool_that_asks_for_a_sandbox(tmp_path: Path) -> None:
    report = _check(tmp_path, "    source: python\n    entrypoint: json:dumps\n    sandbox: true\n")
    assert not report["ok"]
    [problem] = _problems(report)
    assert "python tool" in problem
    assert "sandbox" in problem


def test_skills_check_names_an_http_mcp_server_that_asks_for_a_sandbox(tmp_path: Path) -> None:
    report = _check(
        tmp_path,
        "    source: mcp\n    server: {url: 'https://mcp.example.test/mcp'}\n"
        "    remote_tool: x\n    sandbox: true\n",
    )
    assert not report["ok"]
    assert any("sandbox is for stdio servers" in p for p in _problems(report)), report
    stdio = _check(
        tmp_path,
        "    source: mcp\n    server: {command: [my-server]}\n    remote_tool: x\n"
        "    sandbox: {network: [api.example.com]}\n",
    )
    assert stdio["ok"], stdio
