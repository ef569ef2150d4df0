"""The tool-kind seam, in process: the registry, kind-specific spec checks, and time-outs.

Every kind reports a time-out the same way (``ToolTimedOut``); the runtime also
treats a result that comes back after the deadline as that time-out. The queue
path of a kind from outside the package is in ``test_tool_kind_plugin.py``.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from cleveragents.errors import (
    ConfigurationError,
    ToolActivationError,
    ToolExecutionError,
    ToolTimedOut,
)
from cleveragents.runtime import (
    ToolOutput,
    invoke,
    load_tool_kinds,
    register_tool_kind,
)
from cleveragents.runtime.kinds import command as command_tool
from cleveragents.runtime.kinds import python as python_tool
from cleveragents.skills import SkillErrorType, SkillResult, ToolSpec, tool_kinds
from cleveragents.skills.loader import load_file
from tests.fixtures.catalogues import cmd_tool, py_tool, request, single

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kind registry as it was before the test, whatever the test registers."""
    monkeypatch.setattr(tool_kinds, "_kinds", dict(tool_kinds._kinds))
    monkeypatch.setattr(tool_kinds, "_pending", dict(tool_kinds._pending))


class Echo:
    """A minimal kind: returns its arguments, optionally after a pause."""

    def __init__(self, pause_s: float = 0.0, result: Any = None) -> None:
        self.pause_s = pause_s
        self.result = result
        self.calls: list[tuple[str, dict[str, Any], float]] = []

    def run(self, tool: ToolSpec, arguments: dict[str, Any], timeout_s: float) -> Any:
        self.calls.append((tool.name, arguments, timeout_s))
        time.sleep(self.pause_s)  # the fake tool's own running time (a scenario, not a wait)
        return dict(arguments) if self.result is None else self.result


class Remote:
    """A kind with its own keys, as the ``mcp`` kind will have (SPEC section 10)."""

    option_fields = ("server", "remote_tool")

    def check(self, tool: ToolSpec) -> None:
        if "server" not in tool.options or "remote_tool" not in tool.options:
            raise ValueError(f"remote tool {tool.name!r} needs server and remote_tool")

    def run(self, tool: ToolSpec, arguments: dict[str, Any], timeout_s: float) -> Any:
        return {"called": tool.options["remote_tool"]}


def _failed(result: SkillResult, error_type: SkillErrorType) -> dict[str, Any]:
    assert not result.success, result
    assert result.error is not None
    assert result.error.error_type == error_type, result.error
    return result.error.details


# --------------------------------------------------------------------------- the registry


def test_python_and_command_are_the_built_in_kinds() -> None:
    assert {"python", "command"} <= set(tool_kinds.kind_names())
    assert tool_kinds.lookup("python") is python_tool.KIND
    assert tool_kinds.lookup("command") is command_tool.KIND
    assert tool_kinds.lookup("no-such-kind") is None


def test_importing_the_skills_layer_imports_no_runtime() -> None:
    code = (
        "import sys, cleveragents.skills\n"
        "loaded = [m for m in sys.modules if m.startswith('cleveragents.runtime')]\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr


def test_a_registered_kind_runs_its_tools_through_invoke() -> None:
    echo = Echo()
    register_tool_kind("echo", echo)
    cat = single(ToolSpec(name="test/echo", source="echo", timeout_s=2))

    result = invoke(request("test/echo", arguments={"text": "hi"}), cat)

    assert result.success, result.error
    assert result.output_data == {"text": "hi"}
    assert echo.calls == [("test/echo", {"text": "hi"}, 2)]


def test_a_kind_may_return_a_tool_output_with_resource_changes() -> None:
    change = {"action": "created", "resource": "memory://x"}
    register_tool_kind("echo", Echo(result=ToolOutput({"ok": True}, [change])))

    result = invoke(request("test/echo"), single(ToolSpec(name="test/echo", source="echo")))

    assert result.success, result.error
    assert result.output_data == {"ok": True}
    assert result.resource_changes == [change]


def test_registering_the_same_runner_twice_does_nothing() -> None:
    echo = Echo()
    register_tool_kind("echo", echo)
    register_tool_kind("echo", echo)

    assert tool_kinds.lookup("echo") is echo


@pytest.mark.parametrize("name", ["python", "command", "mcp"])
def test_a_built_in_kind_cannot_be_replaced(name: str) -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_tool_kind(name, Echo())


def test_a_second_runner_for_a_taken_name_is_refused() -> None:
    register_tool_kind("echo", Echo())

    with pytest.raises(ValueError, match="'echo' is already registered"):
        register_tool_kind("echo", Echo())


@pytest.mark.parametrize("name", ["", "Echo", "my kind", "9lives", "a/b", 5])
def test_a_kind_name_is_lowercase_text(name: Any) -> None:
    with pytest.raises(ValueError, match="tool kind name"):
        register_tool_kind(name, Echo())


def test_a_runner_without_a_run_method_is_refused() -> None:
    with pytest.raises(TypeError, match="run"):
        register_tool_kind("broken", object())  # type: ignore[arg-type]
    assert not tool_kinds.is_known("broken")


def test_a_kind_may_not_claim_a_common_field_as_its_own() -> None:
    class Shadow(Echo):
        option_fields = ("command",)

    with pytest.raises(ValueError, match="command"):
        register_tool_kind("shadow", Shadow())


# --------------------------------------------------------------------------- spec checks


def _load(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "skill.yaml"
    path.write_text(text, encoding="utf-8")
    _, problems = load_file(path)
    return [p.reason for p in problems]


def test_an_unknown_source_is_a_load_problem_naming_the_known_kinds(tmp_path: Path) -> None:
    reasons = _load(
        tmp_path, "name: test/s\ntools:\n  - {name: test/t, source: shell, command: [ls]}\n"
    )

    [reason] = reasons
    assert "unknown tool source 'shell'; known: command, mcp, python" in reason


def test_a_registered_kind_is_named_among_the_known_ones(tmp_path: Path) -> None:
    register_tool_kind("echo", Echo())

    [reason] = _load(tmp_path, "name: test/s\ntools:\n  - {name: test/t, source: shell}\n")

    assert "known: command, echo, mcp, python" in reason


def test_the_built_in_checks_keep_their_messages() -> None:
    with pytest.raises(ValidationError, match="python tool 'test/t' needs entrypoint"):
        ToolSpec(name="test/t", source="python")
    with pytest.raises(ValidationError, match="command tool 'test/t' needs command"):
        ToolSpec(name="test/t", source="command")


def test_a_kinds_own_check_makes_a_bad_spec_a_load_problem(tmp_path: Path) -> None:
    register_tool_kind("remote", Remote())

    [reason] = _load(
        tmp_path, "name: test/s\ntools:\n  - {name: test/t, source: remote, server: {url: x}}\n"
    )

    assert "remote tool 'test/t' needs server and remote_tool" in reason


def test_a_kinds_own_keys_are_kept_in_options() -> None:
    register_tool_kind("remote", Remote())
    server = {"command": ["remote-server"]}

    beside = ToolSpec.model_validate(
        {"name": "test/t", "source": "remote", "server": server, "remote_tool": "search"}
    )
    options = {"server": server, "remote_tool": "search"}
    inside = ToolSpec.model_validate({"name": "test/t", "source": "remote", "options": options})

    assert beside == inside
    assert beside.options == {"server": server, "remote_tool": "search"}
    assert ToolSpec.model_validate(beside.model_dump()) == beside


def test_a_key_given_twice_or_not_the_kinds_own_is_refused() -> None:
    register_tool_kind("remote", Remote())
    base = {"name": "test/t", "source": "remote", "server": {}, "remote_tool": "search"}

    with pytest.raises(ValidationError, match="server given both"):
        ToolSpec.model_validate({**base, "options": {"server": {}}})
    with pytest.raises(ValidationError, match="colour"):
        ToolSpec.model_validate({**base, "colour": "red"})
    with pytest.raises(ValidationError, match="does not take options colour"):
        ToolSpec.model_validate({**base, "options": {"colour": "red"}})


def test_the_built_in_kinds_take_no_options() -> None:
    with pytest.raises(ValidationError, match="python tool 'test/t' does not take options"):
        ToolSpec(name="test/t", source="python", entrypoint="m:f", options={"server": 1})


def test_a_tool_whose_kind_this_process_lacks_is_an_activation_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a catalogue built where the kind exists, run where it does not.
    register_tool_kind("echo", Echo())
    cat = single(ToolSpec(name="test/echo", source="echo"))
    monkeypatch.delitem(tool_kinds._kinds, "echo")

    result = invoke(request("test/echo"), cat)

    assert _failed(result, SkillErrorType.TOOL_ACTIVATION_FAILURE) == {
        "source": "echo",
        "exception_type": "ToolActivationError",
    }
    assert result.error is not None
    assert "no tool kind 'echo'" in result.error.message


def test_a_kind_that_breaks_its_contract_still_gives_a_result() -> None:
    class Buggy:
        def run(self, tool: ToolSpec, arguments: dict[str, Any], timeout_s: float) -> Any:
            raise RuntimeError("kind bug")

    register_tool_kind("buggy", Buggy())

    result = invoke(request("test/t"), single(ToolSpec(name="test/t", source="buggy")))

    assert _failed(result, SkillErrorType.TOOL_EXECUTION_FAILURE)["exception_type"] == (
        "RuntimeError"
    )


# --------------------------------------------------------------------------- plugin modules


PLUGIN = "tests.fixtures.upper_kind"


@pytest.fixture
def fresh_plugin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The plugin module not yet imported, so that loading it registers its kind here."""
    monkeypatch.delitem(sys.modules, PLUGIN, raising=False)
    yield
    sys.modules.pop(PLUGIN, None)  # its kind leaves the registry with this test


@pytest.mark.usefixtures("fresh_plugin")
def test_a_plugin_module_registers_its_kind_when_loaded() -> None:
    assert not tool_kinds.is_known("upper")

    load_tool_kinds([PLUGIN])

    shout = ToolSpec.model_validate({"name": "test/shout", "source": "upper", "field": "text"})
    result = invoke(request("test/shout", arguments={"text": "hey"}), single(shout))
    assert result.output_data == {"text": "HEY"}
    assert result.resource_changes == [{"action": "changed", "resource": "argument/text"}]


@pytest.mark.parametrize(
    ("module", "cause"),
    [
        ("tests.fixtures.no_such_kind_module", "ModuleNotFoundError"),
        ("tests.fixtures.raises_on_import", "RuntimeError"),
    ],
)
def test_a_plugin_module_that_cannot_load_is_a_configuration_error(module: str, cause: str) -> None:
    with pytest.raises(ConfigurationError, match=f"cannot load tool kind module '{module}'"):
        load_tool_kinds([module])
    with pytest.raises(ConfigurationError, match=cause):
        load_tool_kinds([module])


# --------------------------------------------------------------------------- time-outs

TIMEOUT_S = 0.4
SLACK_S = 1.0
_SLEEPER = ["python3", "-c", "import time; time.sleep(30)"]


@pytest.mark.parametrize(
    "tool",
    [
        py_tool("test/slow", "hang", timeout_s=TIMEOUT_S),
        ToolSpec(name="test/slow", source="command", command=_SLEEPER, timeout_s=TIMEOUT_S),
    ],
    ids=["python", "command"],
)
def test_every_kind_reports_a_time_out_the_same_way(tool: ToolSpec) -> None:
    started = time.monotonic()
    result = invoke(request("test/slow"), single(tool))
    elapsed = time.monotonic() - started

    details = _failed(result, SkillErrorType.TOOL_EXECUTION_FAILURE)
    assert result.error is not None
    assert result.error.message == "tool 'test/slow' timed out after 0.4s and was stopped"
    assert details["reason"] == "timeout"
    assert details["timeout_s"] == TIMEOUT_S
    assert details["exception_type"] == "ToolTimedOut"
    assert TIMEOUT_S <= elapsed < TIMEOUT_S + SLACK_S


def test_the_python_kind_raises_the_time_out_itself() -> None:
    tool = py_tool("test/slow", "hang")

    with pytest.raises(ToolTimedOut) as raised:
        python_tool.KIND.run(tool, {"seconds": 5}, 0.2)

    assert raised.value.details == {"reason": "timeout", "timeout_s": 0.2}


def test_the_command_kind_raises_the_time_out_itself() -> None:
    tool = ToolSpec(name="test/slow", source="command", command=_SLEEPER)

    with pytest.raises(ToolTimedOut) as raised:
        command_tool.KIND.run(tool, {}, 0.2)

    assert raised.value.details["reason"] == "timeout"
    assert raised.value.details["timeout_s"] == 0.2
    assert "stderr_tail" in raised.value.details


def test_a_result_that_comes_back_after_the_deadline_is_a_time_out() -> None:
    late = Echo(pause_s=0.3, result={"fine": True})
    register_tool_kind("late", late)
    cat = single(ToolSpec(name="test/late", source="late", timeout_s=0.1))

    result = invoke(request("test/late"), cat)

    details = _failed(result, SkillErrorType.TOOL_EXECUTION_FAILURE)
    assert result.error is not None
    assert result.error.message == "tool 'test/late' timed out after 0.1s and was stopped"
    assert details == {"reason": "timeout", "timeout_s": 0.1, "exception_type": "ToolTimedOut"}
    assert late.calls, "the kind ran"


def test_a_result_within_the_deadline_stands() -> None:
    register_tool_kind("prompt", Echo(pause_s=0.01, result={"fine": True}))
    cat = single(ToolSpec(name="test/prompt", source="prompt", timeout_s=5))

    assert invoke(request("test/prompt"), cat).output_data == {"fine": True}


# --------------------------------------------------------------------------- own exceptions


def test_the_python_kind_translates_the_tools_own_exceptions() -> None:
    with pytest.raises(ToolExecutionError) as raised:
        python_tool.KIND.run(py_tool("test/t", "raise_value_error"), {}, 5)
    assert raised.value.details == {"exception_type": "ValueError"}

    with pytest.raises(ToolExecutionError) as exited:
        python_tool.KIND.run(py_tool("test/t", "call_sys_exit"), {"code": 4}, 5)
    assert exited.value.details == {"exit_code": 4, "exception_type": "SystemExit"}

    with pytest.raises(PermissionError):
        python_tool.KIND.run(py_tool("test/t", "raise_permission"), {}, 5)


def test_the_command_kind_translates_start_failures_exit_codes_and_bad_stdout() -> None:
    missing = ToolSpec(name="test/t", source="command", command=["/no/such/program"])
    with pytest.raises(ToolActivationError, match="cannot start"):
        command_tool.KIND.run(missing, {}, 5)

    with pytest.raises(ToolExecutionError) as failed:
        command_tool.KIND.run(cmd_tool("test/t", "cmd_fail"), {}, 5)
    assert failed.value.details["exit_code"] == 3

    with pytest.raises(ToolExecutionError, match="did not print one JSON value"):
        command_tool.KIND.run(cmd_tool("test/t", "cmd_garbage"), {}, 5)


def test_a_skills_metadata_lists_a_registered_kind_among_its_sources() -> None:
    register_tool_kind("echo", Echo())

    defined = single(ToolSpec(name="test/e", source="echo"), py_tool("test/ok", "ok"))

    assert defined.list()[0].source_types == ["echo", "python"]
