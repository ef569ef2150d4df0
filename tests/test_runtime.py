"""The tool runtime, through ``cleveragents.runtime.invoke``: every outcome is a ``SkillResult``.

One test per error type, then schemas, misbehaving python tools (crashes, ``sys.exit``,
hangs, loops that swallow exceptions), misbehaving command tools (garbage, exit codes,
hangs with children, shell metacharacters, secrets), resource changes, malformed
requests and timeouts. Tool fixtures live in ``tests/fixtures``.
"""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cleveragents.constants import MAX_REQUEST_BYTES
from cleveragents.runtime import (
    DEFAULT_TIMEOUT_S,
    SkillInvocationRequest,
    ToolTimeout,
    effective_timeout,
    invoke,
)
from cleveragents.skills import (
    Catalogue,
    ResolvedToolEntry,
    SkillDefinition,
    SkillErrorType,
    SkillResult,
    ToolSpec,
)
from tests.fixtures import tools as fixture_tools
from tests.fixtures.catalogues import (
    SKILL,
    catalogue,
    cmd_tool,
    examples_catalogue,
    py_tool,
    request,
    single,
    skill,
)

#: Timeout of the tests' hanging tools, and how much later than it they must be stopped.
TIMEOUT_S = 0.3
SLACK_S = 0.5

WORD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"text": {"type": "string"}},
    "required": ["text"],
}
COUNT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"count": {"type": "integer"}},
    "required": ["count"],
}


def run(req: Any, cat: Catalogue, **options: Any) -> SkillResult:
    """Invoke, and check what every result must satisfy: it travels as JSON."""
    result = invoke(req, cat, **options)
    assert isinstance(result, SkillResult)
    json.loads(result.model_dump_json())
    assert result.duration_ms > 0
    if result.success:
        assert result.error is None
    else:
        assert result.error is not None
        assert "Traceback" not in result.error.message
    return result


def failed(result: SkillResult, error_type: SkillErrorType) -> dict[str, Any]:
    """Assert the result failed with ``error_type``; return the error's details."""
    assert not result.success, result
    assert result.error is not None
    assert result.error.error_type == error_type, result.error
    assert result.error.skill_name == result.skill_name
    return result.error.details


def gone(pid: int) -> bool:
    """True when the process no longer runs (reaped, or a zombie nobody reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rpartition(")")[2].split()[0] in ("Z", "X")


def wait_until_gone(pid: int, within_s: float = 2.0) -> bool:
    """Wait a little for a killed process to disappear."""
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        if gone(pid):
            return True
        time.sleep(0.02)
    return gone(pid)


def still_usable(cat: Catalogue | None = None) -> None:
    """A timed-out tool leaves nothing behind: later invocations and plain code run normally."""
    cat = cat or single(py_tool("test/ok", "ok"))
    result = run(request("test/ok"), cat)
    assert result.success, result
    assert result.output_data == {"ok": True}
    # A stray interruption (a timer or watchdog left armed) would surface in this loop.
    end = time.monotonic() + 0.2
    spins = 0
    while time.monotonic() < end:
        spins += 1
    assert spins > 0


def in_thread(req: Any, cat: Catalogue) -> tuple[SkillResult, float]:
    """Invoke from a thread that is not the main thread; return the result and elapsed time."""
    box: dict[str, Any] = {}

    def target() -> None:
        started = time.monotonic()
        box["result"] = invoke(req, cat)
        box["elapsed"] = time.monotonic() - started

    thread = threading.Thread(target=target, name="not-main", daemon=True)
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive(), "the tool was never stopped"
    return box["result"], box["elapsed"]


# --- one test per error type ----------------------------------------------------------------


def test_an_unknown_skill_is_skill_not_found_even_when_its_name_contains_cycle() -> None:
    result = run(request("ops/tool", "ops/bicycle"), single(py_tool("test/ok", "ok")))

    failed(result, SkillErrorType.SKILL_NOT_FOUND)
    assert result.skill_name == "ops/bicycle"
    assert result.tool_name == "ops/tool"


def test_a_skill_whose_include_is_missing_is_a_resolution_failure() -> None:
    cat = catalogue(skill("ops/deploy", py_tool("ops/ok", "ok"), includes=["ops/lifecycle"]))

    result = run(request("ops/ok", "ops/deploy"), cat)

    failed(result, SkillErrorType.RESOLUTION_FAILURE)
    assert result.error is not None
    assert "ops/lifecycle" in result.error.message


def test_a_tool_that_is_not_part_of_the_skill_is_a_resolution_failure() -> None:
    cat = catalogue(
        skill("test/one", py_tool("test/ok", "ok")),
        skill("test/two", py_tool("test/other", "ok")),
    )

    result = run(request("test/other", "test/one"), cat)

    details = failed(result, SkillErrorType.RESOLUTION_FAILURE)
    assert details["tool"] == "test/other"


def test_a_request_naming_code_instead_of_a_tool_imports_nothing() -> None:
    result = run(request("os:system", arguments={"command": "true"}), single(py_tool("t/ok", "ok")))

    failed(result, SkillErrorType.RESOLUTION_FAILURE)


def test_a_request_carrying_an_entrypoint_is_refused_as_invalid() -> None:
    req = request("test/ok", entrypoint="os:system")

    result = run(req, single(py_tool("test/ok", "ok")))

    failed(result, SkillErrorType.VALIDATION_ERROR)


def test_an_include_cycle_is_cycle_detected_and_names_the_path() -> None:
    cat = catalogue(
        skill("local/a", py_tool("local/ok", "ok"), includes=["local/b"]),
        skill("local/b", includes=["local/a"]),
    )

    result = run(request("local/ok", "local/a"), cat)

    failed(result, SkillErrorType.CYCLE_DETECTED)
    assert result.error is not None
    assert "local/a -> local/b -> local/a" in result.error.message


@pytest.mark.parametrize(
    ("entrypoint", "needle"),
    [
        ("tests.fixtures.no_such_module:tool", "no_such_module"),
        ("tests.fixtures.tools:no_such_function", "not a callable"),
        ("tests.fixtures.tools:COUNT_FILE_ENV", "not a callable"),
        ("tests.fixtures.tools:STARTED.nothing", "not a callable"),
        ("tests.fixtures.raises_on_import:tool", "cannot be imported"),
    ],
    ids=["missing-module", "missing-function", "not-callable", "bad-path", "raises-on-import"],
)
def test_a_python_tool_that_cannot_be_activated_is_a_tool_activation_failure(
    entrypoint: str, needle: str
) -> None:
    cat = single(ToolSpec(name="test/t", source="python", entrypoint=entrypoint))

    for _ in range(2):  # a failed activation is not cached as a success, nor as a crash
        result = run(request("test/t"), cat)
        failed(result, SkillErrorType.TOOL_ACTIVATION_FAILURE)
        assert result.error is not None
        assert needle in result.error.message


def test_a_command_tool_whose_program_does_not_exist_is_a_tool_activation_failure() -> None:
    tool = ToolSpec(name="test/cmd", source="command", command=["/nonexistent/program-xyz", "-x"])

    result = run(request("test/cmd"), single(tool))

    failed(result, SkillErrorType.TOOL_ACTIVATION_FAILURE)


def test_a_crashing_tool_is_a_tool_execution_failure_with_its_class_name() -> None:
    result = run(request("test/crash"), single(py_tool("test/crash", "crash")))

    details = failed(result, SkillErrorType.TOOL_EXECUTION_FAILURE)
    assert details["exception_type"] == "RuntimeError"
    assert result.error is not None
    assert "the tool crashed" in result.error.message


def test_a_tools_own_value_error_is_an_execution_failure_not_a_resolution_failure() -> None:
    # Its message says "not found" and "cycle": the text rules must not apply to it.
    result = run(request("test/v"), single(py_tool("test/v", "raise_value_error")))

    details = failed(result, SkillErrorType.TOOL_EXECUTION_FAILURE)
    assert details["exception_type"] == "ValueError"


def test_a_tools_own_permission_error_is_permission_denied() -> None:
    result = run(request("test/p"), single(py_tool("test/p", "raise_permission")))

    details = failed(result, SkillErrorType.PERMISSION_DENIED)
    assert details["exception_type"] == "PermissionError"


def test_a_write_refused_by_a_gate_is_permission_denied() -> None:
    tool = py_tool("test/w", "record_start", writes=True)

    result = run(request("test/w", allow_writes=False), single(tool))

    details = failed(result, SkillErrorType.PERMISSION_DENIED)
    assert details["gate"] == "request_disallows_writes"


def test_arguments_of_the_wrong_type_are_a_validation_error_naming_the_path() -> None:
    cat = single(py_tool("test/echo", "echo", input_schema=WORD_SCHEMA))

    result = run(request("test/echo", arguments={"text": 3}), cat)

    details = failed(result, SkillErrorType.VALIDATION_ERROR)
    assert result.error is not None
    assert "arguments.text: an integer is not of type 'string'" in result.error.message
    assert details["schema"] == "tool input_schema"


def test_missing_required_arguments_are_a_validation_error() -> None:
    cat = single(py_tool("test/echo", "echo", input_schema=WORD_SCHEMA))

    result = run(request("test/echo", arguments={}), cat)

    failed(result, SkillErrorType.VALIDATION_ERROR)
    assert result.error is not None
    assert "text" in result.error.message


def test_invalid_arguments_never_start_the_tool() -> None:
    fixture_tools.STARTED.clear()
    cat = single(py_tool("test/rec", "record_start", input_schema=WORD_SCHEMA))

    result = run(request("test/rec", arguments={"text": ["not", "a", "string"]}), cat)

    failed(result, SkillErrorType.VALIDATION_ERROR)
    assert fixture_tools.STARTED == []


def test_the_skills_input_schema_is_applied_after_the_tools() -> None:
    skill_schema = {"type": "object", "properties": {"text": {"maxLength": 3}}}
    cat = single(py_tool("test/echo", "echo", input_schema=WORD_SCHEMA), input_schema=skill_schema)

    result = run(request("test/echo", arguments={"text": "too long"}), cat)

    details = failed(result, SkillErrorType.VALIDATION_ERROR)
    assert details["schema"] == "skill input_schema"
    assert run(request("test/echo", arguments={"text": "ok"}), cat).success


def test_output_that_breaks_the_tools_output_schema_is_a_validation_error() -> None:
    cat = single(py_tool("test/out", "wrong_output", output_schema=COUNT_SCHEMA))

    result = run(request("test/out"), cat)

    details = failed(result, SkillErrorType.VALIDATION_ERROR)
    assert details["schema"] == "tool output_schema"
    assert result.error is not None
    assert "output.count" in result.error.message
    assert "is not of type 'integer'" in result.error.message


def test_output_that_breaks_the_skills_output_schema_is_a_validation_error() -> None:
    skill_schema = {"type": "object", "properties": {"count": {"maximum": 10}}}
    cat = single(
        py_tool("test/count", "count_output", output_schema=COUNT_SCHEMA),
        output_schema=skill_schema,
    )

    result = run(request("test/count", arguments={"count": 11}), cat)

    details = failed(result, SkillErrorType.VALIDATION_ERROR)
    assert details["schema"] == "skill output_schema"
    assert run(request("test/count", arguments={"count": 10}), cat).success


# --- misbehaving python tools ---------------------------------------------------------------


def test_a_tool_calling_sys_exit_is_an_execution_failure_and_the_process_lives_on() -> None:
    cat = single(py_tool("test/exit", "call_sys_exit"), py_tool("test/ok", "ok"))

    result = run(request("test/exit", arguments={"code": 3}), cat)

    details = failed(result, SkillErrorType.TOOL_EXECUTION_FAILURE)
    assert details["exit_code"] == 3
    still_usable(cat)


@pytest.mark.parametrize("function", ["return_set", "return_object", "return_nan"])
def test_a_return_value_that_is_not_json_is_a_tool_execution_failure(function: str) -> None:
    result = run(request("test/bad"), single(py_tool("test/bad", function)))

    failed(result, SkillErrorType.TOOL_EXECUTION_FAILURE)
    assert result.error is not None
    assert "JSON" in result.error.message


def test_output_is_delivered_as_the_json_wire_carries_it() -> None:
    schema = {"type": "object", "properties": {"1": {"type": "string"}}, "required": ["1"]}
    cat = single(py_tool("test/keys", "return_int_keys", output_schema=schema))

    result = run(request("test/keys"), cat)

    assert result.success, result
    assert result.output_data == {"1": "one", "2": "two"}


def test_a_hanging_tool_in_the_main_thread_is_stopped_at_its_timeout() -> None:
    assert threading.current_thread() is threading.main_thread()
    cat = single(py_tool("test/hang", "hang", timeout_s=TIMEOUT_S))

    started = time.monotonic()
    result = run(request("test/hang"), cat)
    elapsed = time.monotonic() - started

    details = failed(result, SkillErrorType.TOOL_EXECUTION_FAILURE)
    assert details["reason"] == "timeout"
    assert details["timeout_s"] == TIMEOUT_S
    assert TIMEOUT_S <= elapsed < TIMEOUT_S + SLACK_S
    still_usable()


def test_a_busy_loop_that_catches_exception_is_still_stopped(tmp_path: Path) -> None:
    marker = tmp_path / "finished"
    cat = single(py_tool("test/busy", "busy_loop", timeout_s=TIMEOUT_S))

    started = time.monotonic()
    result = run(request("test/busy", arguments={"seconds": 5, "marker": str(marker)}), cat)
    elapsed = time.monotonic() - started

    assert failed(result, SkillErrorType.TOOL_EXECUTION_FAILURE)["reason"] == "timeout"
    assert elapsed < TIMEOUT_S + SLACK_S
    still_usable()
    assert not marker.exists()


def test_a_tool_that_swallows_the_timeout_once_is_stopped_by_the_repeat(tmp_path: Path) -> None:
    marker = tmp_path / "finished"
    cat = single(py_tool("test/swallow", "swallow_timeout_once", timeout_s=TIMEOUT_S))

    started = time.monotonic()
    result = run(request("test/swallow", arguments={"seconds": 2, "marker": str(marker)}), cat)
    elapsed = time.monotonic() - started

    assert failed(result, SkillErrorType.TOOL_EXECUTION_FAILURE)["reason"] == "timeout"
    assert elapsed < TIMEOUT_S + SLACK_S
    still_usable()
    assert not marker.exists(), "the tool went on after it was stopped"


def test_a_busy_tool_in_another_thread_is_stopped_at_its_timeout(tmp_path: Path) -> None:
    marker = tmp_path / "finished"
    cat = single(py_tool("test/busy", "busy_loop", timeout_s=TIMEOUT_S), py_tool("test/ok", "ok"))

    result, elapsed = in_thread(
        request("test/busy", arguments={"seconds": 5, "marker": str(marker)}), cat
    )

    assert failed(result, SkillErrorType.TOOL_EXECUTION_FAILURE)["reason"] == "timeout"
    assert TIMEOUT_S <= elapsed < TIMEOUT_S + SLACK_S
    after, _ = in_thread(request("test/ok"), cat)
    assert after.success, after
    still_usable(cat)
    assert not marker.exists()


def test_a_tool_in_another_thread_that_swallows_the_timeout_once_is_stopped(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "finished"
    cat = single(py_tool("test/swallow", "swallow_timeout_once", timeout_s=TIMEOUT_S))

    # seconds=0.6: the first sleep outlives the deadline, then the tool spins busily.
    result, elapsed = in_thread(
        request("test/swallow", arguments={"seconds": 0.6, "marker": str(marker)}), cat
    )

    assert failed(result, SkillErrorType.TOOL_EXECUTION_FAILURE)["reason"] == "timeout"
    assert elapsed < 0.6 + SLACK_S
    time.sleep(0.1)
    assert not marker.exists(), "the tool went on after it was stopped"


def test_many_threads_with_timeouts_each_get_their_own_result() -> None:
    cat = single(
        py_tool("test/busy", "busy_loop", timeout_s=0.2),
        py_tool("test/ok", "ok"),
    )
    results: list[SkillResult] = []
    lock = threading.Lock()

    def target(tool: str) -> None:
        outcome = invoke(
            request(tool, arguments={"seconds": 5} if tool == "test/busy" else {}), cat
        )
        with lock:
            results.append(outcome)

    threads = [
        threading.Thread(target=target, args=("test/busy" if i % 2 else "test/ok",))
        for i in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)

    assert len(results) == 8
    assert sum(r.success for r in results) == 4
    for r in results:
        if not r.success:
            assert r.error is not None
            assert r.error.details["reason"] == "timeout"


def test_a_timer_set_outside_the_runtime_is_kept() -> None:
    fired: list[int] = []
    previous_handler = signal.signal(signal.SIGALRM, lambda signum, frame: fired.append(signum))
    previous_timer = signal.setitimer(signal.ITIMER_REAL, 5.0)
    try:
        result = run(request("test/ok"), single(py_tool("test/ok", "ok", timeout_s=1)))
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert result.success
        assert 4.0 < left <= 5.0
        assert signal.getsignal(signal.SIGALRM) is not None
        assert fired == []
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler)
        if previous_timer[0] > 0:
            signal.setitimer(signal.ITIMER_REAL, *previous_timer)


# --- command tools --------------------------------------------------------------------------


def test_a_command_tool_gets_its_arguments_on_stdin_and_returns_its_json() -> None:
    cat = single(cmd_tool("test/stdin", "cmd_stdin"))

    result = run(request("test/stdin", arguments={"text": "héllo", "n": 2}), cat)

    assert result.success, result
    assert result.output_data["arguments"] == {"text": "héllo", "n": 2}
    assert result.output_data["argv"] == []


def test_a_command_tool_that_prints_garbage_is_a_tool_execution_failure() -> None:
    result = run(request("test/garbage"), single(cmd_tool("test/garbage", "cmd_garbage")))

    details = failed(result, SkillErrorType.TOOL_EXECUTION_FAILURE)
    assert "not JSON" in details["stdout_head"]
    assert details["exit_code"] == 0


def test_a_command_tool_exiting_non_zero_reports_its_exit_code_and_stderr_tail() -> None:
    result = run(request("test/fail"), single(cmd_tool("test/fail", "cmd_fail")))

    details = failed(result, SkillErrorType.TOOL_EXECUTION_FAILURE)
    assert details["exit_code"] == 3
    assert "fatal: the widget is broken" in details["stderr_tail"]


def test_a_command_time_out_kills_the_whole_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    cat = single(cmd_tool("test/hang", "cmd_hang", timeout_s=1.0))

    started = time.monotonic()
    result = run(request("test/hang", arguments={"pid_file": str(pid_file)}), cat)
    elapsed = time.monotonic() - started

    details = failed(result, SkillErrorType.TOOL_EXECUTION_FAILURE)
    assert details["reason"] == "timeout"
    assert elapsed < 1.0 + SLACK_S
    child = int(pid_file.read_text())
    assert wait_until_gone(child), f"child {child} outlived its tool"


def test_no_shell_sees_the_arguments_of_a_command_tool(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    keep = tmp_path / "keep"
    keep.write_text("still here")
    nasty = f"$(touch {marker}); rm -rf {keep}; `touch {marker}` | true && echo $HOME"
    cat = single(cmd_tool("test/stdin", "cmd_stdin"))

    result = run(request("test/stdin", arguments={"text": nasty}), cat)

    assert result.success, result
    assert result.output_data["arguments"] == {"text": nasty}
    assert result.output_data["argv"] == []
    assert not marker.exists()
    assert keep.read_text() == "still here"


def test_a_command_tool_does_not_get_the_workers_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLEVERAGENTS_TEST_SECRET", "hunter2")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "also-secret")
    cat = single(cmd_tool("test/env", "cmd_env"))

    result = run(request("test/env", arguments={"show": "CLEVERAGENTS_TEST_SECRET"}), cat)

    assert result.success, result
    keys = result.output_data["keys"]
    assert "CLEVERAGENTS_TEST_SECRET" not in keys
    assert "AWS_SECRET_ACCESS_KEY" not in keys
    assert "CLEVERAGENTS_RESOURCE_CHANGES" in keys
    assert result.output_data["value"] is None


def test_a_command_tool_gets_exactly_the_variables_its_pass_env_lists(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CLEVERAGENTS_TEST_SECRET", "hunter2")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "also-secret")
    cat = single(cmd_tool("test/env", "cmd_env", pass_env=["CLEVERAGENTS_TEST_SECRET"]))

    result = run(request("test/env", arguments={"show": "CLEVERAGENTS_TEST_SECRET"}), cat)

    assert result.success, result
    assert result.output_data["value"] == "hunter2"
    assert "AWS_SECRET_ACCESS_KEY" not in result.output_data["keys"]


# --- resource changes -----------------------------------------------------------------------


def test_resource_changes_from_tool_output_land_in_the_result() -> None:
    cat = single(py_tool("test/changes", "with_changes"))

    result = run(request("test/changes", arguments={"resource": "db://row/1"}), cat)

    assert result.success, result
    assert result.output_data == {"ok": True}
    assert result.resource_changes == [
        {"action": "created", "resource": "db://row/1"},
        {"action": "changed", "resource": "db://row/1", "note": "then edited"},
    ]


def test_resource_changes_from_the_command_file_land_in_the_result() -> None:
    lines = [
        json.dumps({"action": "created", "resource": "file:///a"}),
        "",
        json.dumps({"action": "deleted", "resource": "file:///b", "size": 3}),
    ]
    cat = single(cmd_tool("test/changes", "cmd_changes"))

    result = run(request("test/changes", arguments={"lines": lines}), cat)

    assert result.success, result
    assert result.resource_changes == [
        {"action": "created", "resource": "file:///a"},
        {"action": "deleted", "resource": "file:///b", "size": 3},
    ]


@pytest.mark.parametrize(
    "function",
    ["bad_changes_not_list", "bad_changes_action", "bad_changes_no_resource"],
)
def test_malformed_resource_changes_from_a_python_tool_are_reported(function: str) -> None:
    result = run(request("test/bad"), single(py_tool("test/bad", function)))

    failed(result, SkillErrorType.VALIDATION_ERROR)
    assert result.error is not None
    assert "resource changes" in result.error.message
    assert result.resource_changes == []


def test_resource_changes_that_are_not_json_are_a_tool_execution_failure() -> None:
    result = run(request("test/bad"), single(py_tool("test/bad", "bad_changes_not_json")))

    failed(result, SkillErrorType.TOOL_EXECUTION_FAILURE)


def test_a_resource_change_line_that_is_not_json_is_reported() -> None:
    lines = [json.dumps({"action": "created", "resource": "r"}), "created r, honest"]
    cat = single(cmd_tool("test/changes", "cmd_changes"))

    result = run(request("test/changes", arguments={"lines": lines}), cat)

    details = failed(result, SkillErrorType.TOOL_EXECUTION_FAILURE)
    assert details["line"] == 2


def test_a_resource_change_line_with_an_unknown_action_is_reported() -> None:
    lines = [json.dumps({"action": "renamed", "resource": "r"})]
    cat = single(cmd_tool("test/changes", "cmd_changes"))

    result = run(request("test/changes", arguments={"lines": lines}), cat)

    failed(result, SkillErrorType.VALIDATION_ERROR)


# --- requests -------------------------------------------------------------------------------


def test_a_prebuilt_request_model_is_accepted() -> None:
    req = SkillInvocationRequest(skill=SKILL, tool="test/echo", arguments={"text": "hi"})

    result = run(req, single(py_tool("test/echo", "echo", input_schema=WORD_SCHEMA)))

    assert result.success, result
    assert result.output_data == {"text": "hi"}


def test_arguments_over_the_request_size_limit_are_a_validation_error() -> None:
    cat = single(py_tool("test/echo", "echo"))
    big = "x" * (MAX_REQUEST_BYTES + 1)

    result = run(request("test/echo", arguments={"text": big}), cat)

    details = failed(result, SkillErrorType.VALIDATION_ERROR)
    assert details["limit"] == MAX_REQUEST_BYTES
    assert (result.skill_name, result.tool_name) == (SKILL, "test/echo")


def test_the_request_size_limit_can_be_lowered() -> None:
    cat = single(py_tool("test/echo", "echo"))

    small = run(request("test/echo", arguments={"text": "x" * 10}), cat, max_request_bytes=100)
    large = run(request("test/echo", arguments={"text": "x" * 200}), cat, max_request_bytes=100)

    assert small.success
    assert failed(large, SkillErrorType.VALIDATION_ERROR)["limit"] == 100


@pytest.mark.parametrize(
    ("raw", "skill_name", "tool_name"),
    [
        (["local/text-tools", "local/echo"], "", ""),
        ("local/echo", "", ""),
        (None, "", ""),
        (42, "", ""),
        ({}, "", ""),
        ({"tool": "local/echo"}, "", "local/echo"),
        ({"skill": "local/text-tools"}, "local/text-tools", ""),
        ({"skill": 5, "tool": "local/echo"}, "", "local/echo"),
        ({"skill": "local/text-tools", "tool": ["local/echo"]}, "local/text-tools", ""),
        ({"skill": "", "tool": "local/echo"}, "", "local/echo"),
        ({"skill": "s/k", "tool": "t/l", "arguments": ["a"]}, "s/k", "t/l"),
        ({"skill": "s/k", "tool": "t/l", "allow_writes": "yes"}, "s/k", "t/l"),
        ({"skill": "s/k", "tool": "t/l", "allow_writes": 1}, "s/k", "t/l"),
        ({"skill": "s/k", "tool": "t/l", "timeout_s": -1}, "s/k", "t/l"),
        ({"skill": "s/k", "tool": "t/l", "timeout_s": "5"}, "s/k", "t/l"),
        ({"skill": "s/k", "tool": "t/l", "request_id": "has spaces"}, "s/k", "t/l"),
        ({"skill": "s/k", "tool": "t/l", "priority": 9}, "s/k", "t/l"),
    ],
    ids=[
        "a-list",
        "a-string",
        "null",
        "a-number",
        "empty",
        "no-skill",
        "no-tool",
        "skill-not-a-string",
        "tool-not-a-string",
        "empty-skill",
        "arguments-not-an-object",
        "allow-writes-a-string",
        "allow-writes-a-number",
        "negative-timeout",
        "timeout-a-string",
        "bad-request-id",
        "extra-field",
    ],
)
def test_a_malformed_request_is_a_validation_error_with_the_names_it_carried(
    raw: Any, skill_name: str, tool_name: str
) -> None:
    result = run(raw, examples_catalogue())

    failed(result, SkillErrorType.VALIDATION_ERROR)
    assert result.skill_name == skill_name
    assert result.tool_name == tool_name


def test_arguments_that_cannot_be_encoded_are_a_validation_error() -> None:
    circular: dict[str, Any] = {}
    circular["self"] = circular

    result = run(request("test/echo", arguments={"text": circular}), single(py_tool("t/x", "ok")))

    failed(result, SkillErrorType.VALIDATION_ERROR)


def test_a_fault_inside_the_worker_still_becomes_a_result() -> None:
    class Broken(Catalogue):
        def find_tool(self, skill: str, tool: str) -> tuple[SkillDefinition, ResolvedToolEntry]:
            raise RuntimeError("catalogue exploded")

    result = run(request("test/ok"), Broken())

    failed(result, SkillErrorType.TOOL_EXECUTION_FAILURE)


# --- timeouts and timing --------------------------------------------------------------------


def _entry(timeout_s: float | None) -> ResolvedToolEntry:
    return ResolvedToolEntry(
        tool=py_tool("test/t", "ok", timeout_s=timeout_s), source_skill=SKILL, via=[]
    )


@pytest.mark.parametrize(
    ("tool_timeout", "request_timeout", "expected"),
    [(5.0, 2.0, 2.0), (2.0, 5.0, 2.0), (5.0, None, 5.0), (None, 2.0, 2.0), (None, None, 7.0)],
)
def test_the_effective_timeout_is_the_smaller_given_else_the_default(
    tool_timeout: float | None, request_timeout: float | None, expected: float
) -> None:
    req = SkillInvocationRequest(skill=SKILL, tool="test/t", timeout_s=request_timeout)

    assert effective_timeout(_entry(tool_timeout), req, 7.0) == expected


def test_the_default_timeout_is_five_minutes() -> None:
    assert DEFAULT_TIMEOUT_S == 300.0


@pytest.mark.parametrize(
    ("tool_timeout", "request_timeout", "default"),
    [(5.0, TIMEOUT_S, 60.0), (TIMEOUT_S, 5.0, 60.0), (None, None, TIMEOUT_S)],
    ids=["request-smaller", "tool-smaller", "default"],
)
def test_a_tool_is_stopped_at_its_effective_timeout(
    tool_timeout: float | None, request_timeout: float | None, default: float
) -> None:
    cat = single(py_tool("test/hang", "hang", timeout_s=tool_timeout))
    req = request("test/hang", timeout_s=request_timeout)

    started = time.monotonic()
    result = run(req, cat, default_timeout_s=default)
    elapsed = time.monotonic() - started

    assert failed(result, SkillErrorType.TOOL_EXECUTION_FAILURE)["timeout_s"] == TIMEOUT_S
    assert elapsed < TIMEOUT_S + SLACK_S


def test_duration_is_measured_for_successes_and_failures() -> None:
    cat = single(py_tool("test/ok", "ok"), py_tool("test/crash", "crash"))

    for tool in ("test/ok", "test/crash", "test/missing"):
        assert run(request(tool), cat).duration_ms > 0
    assert run(None, cat).duration_ms > 0


# --- the example catalogue's writing tools --------------------------------------------------


def test_the_example_python_writer_reports_its_resource_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLEVERAGENTS_NOTES_DIR", str(tmp_path))
    cat = examples_catalogue()
    req = request(
        "local/write-note", "local/notes", arguments={"name": "n1", "text": "hi"}, allow_writes=True
    )

    first = run(req, cat)
    second = run(req, cat)

    note = tmp_path / "n1.txt"
    assert first.success, first
    assert first.output_data == {"path": str(note), "bytes": 2}
    assert first.resource_changes == [{"action": "created", "resource": str(note)}]
    assert second.resource_changes == [{"action": "changed", "resource": str(note)}]
    assert note.read_text() == "hi"


def test_the_example_command_writer_reports_its_resource_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLEVERAGENTS_NOTES_DIR", str(tmp_path))
    cat = examples_catalogue()

    def append(line: str) -> SkillResult:
        args = {"name": "log", "line": line}
        return run(
            request("local/append-note", "local/notes", arguments=args, allow_writes=True), cat
        )

    first, second = append("one"), append("two")

    note = tmp_path / "log.txt"
    assert first.success, first
    assert first.resource_changes == [{"action": "created", "resource": str(note)}]
    assert second.resource_changes == [{"action": "changed", "resource": str(note)}]
    assert second.output_data == {"path": str(note), "lines": 2}
    assert note.read_text() == "one\ntwo\n"


def test_the_example_writers_write_nothing_without_allow_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLEVERAGENTS_NOTES_DIR", str(tmp_path))
    cat = examples_catalogue()

    for tool, args in [
        ("local/write-note", {"name": "n", "text": "t"}),
        ("local/append-note", {"name": "n", "line": "l"}),
    ]:
        result = run(request(tool, "local/notes", arguments=args), cat)
        assert (
            failed(result, SkillErrorType.PERMISSION_DENIED)["gate"] == "request_disallows_writes"
        )
    assert list(tmp_path.iterdir()) == []


def test_the_example_read_tools_work_through_every_skill_that_reaches_them() -> None:
    cat = examples_catalogue()

    for skill_name in ("local/text-tools", "local/notes", "local/research"):
        result = run(request("local/word-count", skill_name, arguments={"text": "a b c"}), cat)
        assert result.output_data == {"words": 3}
    stats = run(request("local/line-stats", "local/research", arguments={"text": "a\nb"}), cat)
    assert stats.output_data == {"lines": 2, "chars": 3}


# --- deadlines under stress -----------------------------------------------------------------


def _near_the_deadline(rounds: int, seed: int) -> tuple[int, int]:
    """Run tools that end just before or just after their deadline; count timeouts and strays.

    A stray is an interruption that surfaces after ``invoke`` returned: in code that is not
    the tool's.
    """
    rng = random.Random(seed)
    cat = single(py_tool("test/busy", "busy_loop", timeout_s=0.005))
    timeouts = strays = 0
    for _ in range(rounds):
        req = request("test/busy", arguments={"seconds": rng.uniform(0.003, 0.007)})
        result = invoke(req, cat)
        if not result.success:
            assert result.error is not None
            assert result.error.details["reason"] == "timeout", result.error
            timeouts += 1
        try:
            end = time.monotonic() + 0.002
            while time.monotonic() < end:
                pass
        except ToolTimeout:
            strays += 1
    return timeouts, strays


def test_tools_ending_at_their_deadline_never_leave_an_interruption_behind() -> None:
    timeouts, strays = _near_the_deadline(150, seed=1)

    assert strays == 0
    assert 0 < timeouts < 150


def test_threads_ending_at_their_deadline_neither_deadlock_nor_leave_interruptions() -> None:
    outcomes: list[tuple[int, int]] = []

    def target(seed: int) -> None:
        outcomes.append(_near_the_deadline(80, seed))

    threads = [threading.Thread(target=target, args=(seed,), daemon=True) for seed in range(4)]
    for thread in threads:
        thread.start()
    give_up = time.monotonic() + 20
    for thread in threads:
        thread.join(timeout=max(0.0, give_up - time.monotonic()))

    assert not any(t.is_alive() for t in threads), "timed invocations deadlocked"
    assert sum(strays for _, strays in outcomes) == 0
    assert sum(timeouts for timeouts, _ in outcomes) > 0



def test_no_timeout_goes_past_the_maximum() -> None:
    req = SkillInvocationRequest(skill=SKILL, tool="test/t", timeout_s=1e9)

    assert effective_timeout(_entry(None), req, 300.0) == 3600.0
    assert effective_timeout(_entry(None), req, 300.0, 5.0) == 5.0
    unset = req.model_copy(update={"timeout_s": None})
    assert effective_timeout(_entry(None), unset, 9e9, 5.0) == 5.0
