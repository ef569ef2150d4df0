"""The tool runtime, through ``cleveragents.runtime.invoke``: every outcome is a ``SkillResult``.

One test per error type, then schemas, misbehaving python tools (crashes, ``sys.exit``,
hangs, loops that swallow exceptions), misbehaving command tools (garbage, exit codes,
hangs with children, shell metacharacters, secrets), resource changes and
timeouts; requests and the example writers are in test_runtime_requests.py. Tool
fixtures live in ``tests/fixtures``.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import pytest

from cleveragents.constants import MAX_NESTING_DEPTH
from cleveragents.runtime import (
    invoke,
)
from cleveragents.skills import (
    SkillErrorType,
    SkillResult,
    ToolSpec,
)
from tests.fixtures import tools as fixture_tools
from tests.fixtures.catalogues import (
    catalogue,
    cmd_tool,
    py_tool,
    request,
    single,
    skill,
)
from tests.support.runtime_support import (
    COUNT_SCHEMA,
    SLACK_S,
    TIMEOUT_S,
    WORD_SCHEMA,
    failed,
    in_thread,
    run,
    still_usable,
    wait_until_gone,
)

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


@pytest.mark.parametrize("depth", [MAX_NESTING_DEPTH, 300, 5000])
def test_output_nested_past_the_depth_limit_is_a_tool_execution_failure(depth: int) -> None:
    # Deeper, the result could not be stored: pydantic's and JSON's encoders give up.
    cat = single(py_tool("test/deep", "return_deep"))

    result = run(request("test/deep", arguments={"depth": depth}), cat)

    details = failed(result, SkillErrorType.TOOL_EXECUTION_FAILURE)
    assert details["limit"] == MAX_NESTING_DEPTH


def test_output_that_is_not_unicode_is_a_tool_execution_failure() -> None:
    cat = single(py_tool("test/half", "return_lone_surrogate"))

    result = run(request("test/half"), cat)

    failed(result, SkillErrorType.TOOL_EXECUTION_FAILURE)
    assert result.error is not None
    assert "surrogate" in result.error.message


def test_an_error_message_that_is_not_unicode_is_made_writable() -> None:
    cat = single(py_tool("test/raise-half", "raise_lone_surrogate"))

    result = run(request("test/raise-half"), cat)

    failed(result, SkillErrorType.TOOL_EXECUTION_FAILURE)
    assert result.error is not None
    assert result.error.message == "ValueError: cannot read \ufffd"


def test_output_nested_up_to_the_depth_limit_is_delivered() -> None:
    cat = single(py_tool("test/deep", "return_deep"))

    result = run(request("test/deep", arguments={"depth": MAX_NESTING_DEPTH - 2}), cat)

    assert result.success, result.error
    assert result.model_dump_json()


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
    # The tool ran in the invoking thread, which in_thread saw end: it can write no more
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
