"""The tool runtime: malformed requests, effective time-outs, the example catalogue's writers."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cleveragents.constants import MAX_NESTING_DEPTH, MAX_REQUEST_BYTES
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
)
from tests.fixtures.catalogues import (
    SKILL,
    examples_catalogue,
    py_tool,
    request,
    single,
)
from tests.support.runtime_support import (
    SLACK_S,
    TIMEOUT_S,
    WORD_SCHEMA,
    failed,
    run,
)

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


def _nested(depth: int) -> Any:
    """A value ``depth`` containers deep (the arguments object itself is one more)."""
    value: Any = 1
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


@pytest.mark.parametrize("depth", [MAX_NESTING_DEPTH + 1, 900, 5000])
def test_arguments_nested_past_the_depth_limit_are_a_validation_error(depth: int) -> None:
    # Deep enough, a structure breaks every recursive encoder on its way (the size
    # check, the content digest, kombu) at a depth that depends on the call stack.
    cat = single(py_tool("test/echo", "echo"))

    result = run(request("test/echo", arguments={"text": _nested(depth)}), cat)

    details = failed(result, SkillErrorType.VALIDATION_ERROR)
    assert details["limit"] == MAX_NESTING_DEPTH
    assert "nested" in (result.error.message if result.error else "")


def test_arguments_nested_up_to_the_depth_limit_are_accepted() -> None:
    cat = single(py_tool("test/echo", "echo"))

    result = run(request("test/echo", arguments={"text": _nested(MAX_NESTING_DEPTH - 1)}), cat)

    assert result.success, result


@pytest.mark.parametrize(
    "fields",
    [
        {"arguments": {"text": "half \ud800 a pair"}},
        {"arguments": {"text": "a", "\udfff": 1}},
        {"arguments": {"text": ["ok", {"deeper": "\udc00"}]}},
        {"skill": "test/\ud83d"},
        {"tool": "test/echo\udc00"},
        {"request_id": "r-\ud800"},
    ],
    ids=["value", "key", "nested", "skill", "tool", "request_id"],
)
def test_text_that_is_not_unicode_is_a_validation_error(fields: dict[str, Any]) -> None:
    # A JSON escape of half a surrogate pair decodes to text that no UTF-8 file, log,
    # Redis key or terminal can hold: refused up front, named without the text itself
    cat = single(py_tool("test/echo", "echo"))

    result = run({**request("test/echo"), **fields}, cat)

    failed(result, SkillErrorType.VALIDATION_ERROR)
    assert result.error is not None
    if "request_id" not in fields:
        assert "surrogate" in result.error.message


def test_a_surrogate_pair_is_text_like_any_other() -> None:
    cat = single(py_tool("test/echo", "echo"))

    result = run(request("test/echo", arguments={"text": json.loads('"\\ud83d\\ude00"')}), cat)

    assert result.success, result
    assert result.output_data == {"text": "\U0001f600"}


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


def test_a_misspelt_request_field_gets_the_field_meant() -> None:
    cat = single(py_tool("test/echo", "echo"))
    body = {"skill": SKILL, "tool": "test/echo", "arguments": {"text": "hi"}, "alow_writes": True}

    result = run(body, cat)

    assert result.error is not None
    assert result.error.error_type == SkillErrorType.VALIDATION_ERROR
    assert "alow_writes: unknown field; did you mean 'allow_writes'?" in result.error.message
    assert "Extra inputs are not permitted" not in result.error.message
