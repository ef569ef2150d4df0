"""``cleveragents batch``: run, resume, submit, status and results, through the real console script.

Every test talks to a real Redis and real worker processes, except the embedded
default, which has no server at all (only ``CLEVERAGENTS_HOME``). The tests that take
a ``broker`` run on RabbitMQ too, with the Redis as result backend.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
import redis

from cleveragents.batch.source import MAX_LINE_CHARS
from cleveragents.cli.interrupts import Interrupts
from cleveragents.embedded.share import HomeShare, group_alive
from tests.conftest import Broker
from tests.support.procs import FIXTURE_SKILLS, REPO, Worker, kill_group, wait_until

pytestmark = pytest.mark.timeout(300)

StartWorker = Callable[..., Worker]

#: Every line of a results file holds these: the SkillResult fields plus request_id.
RESULT_FIELDS = {
    "skill_name",
    "tool_name",
    "success",
    "output_data",
    "error",
    "duration_ms",
    "resource_changes",
    "request_id",
}

#: A line of each outcome a batch can reach, in the order they are written to the file.
MIXED: list[tuple[dict[str, Any], str | None]] = [
    ({"skill": "test/basic", "tool": "test/echo", "arguments": {"text": "first"}}, None),
    ({"skill": "ops/bicycle", "tool": "ops/wheel"}, "skill_not_found"),
    ({"skill": "test/basic", "tool": "local/word-count"}, "resolution_failure"),
    ({"skill": "test/cycle-a", "tool": "test/echo", "arguments": {"text": "x"}}, "cycle_detected"),
    ({"skill": "test/basic", "tool": "test/missing-module"}, "tool_activation_failure"),
    ({"skill": "test/basic", "tool": "test/crash"}, "tool_execution_failure"),
    ({"skill": "test/basic", "tool": "test/echo", "arguments": {"text": 3}}, "validation_error"),
    (
        {
            "skill": "test/basic",
            "tool": "test/count-write",
            "arguments": {"path": "/nonexistent/never-written"},
            "allow_writes": True,  # does not count: the command has no --allow-writes
        },
        "permission_denied",
    ),
    ({"skill": "test/basic", "tool": "test/echo", "arguments": {"text": "last"}}, None),
]


def cli_env(redis_url: str | None = None, **extra: str) -> dict[str, str]:
    """The environment of a CLI run: none of the caller's CLEVERAGENTS_* settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLEVERAGENTS_")}
    env["PYTHONPATH"] = str(REPO)
    if redis_url is not None:
        env["CLEVERAGENTS_BROKER_URL"] = redis_url
    env.update(extra)
    return env


def run_cli(
    *args: str, env: dict[str, str], cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cleveragents", *args],
        env=env,
        cwd=cwd or REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def write_jsonl(path: Path, lines: Iterable[dict[str, Any] | str]) -> Path:
    """One line per item: dicts as JSON, strings verbatim (for lines that are not requests)."""
    text = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    path.write_text(text, encoding="utf-8")
    return path


def read_results(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def error_type(payload: dict[str, Any]) -> str | None:
    error = payload.get("error")
    return error["error_type"] if error else None


def tally_line(count_file: Path, key: str, sleep_s: float = 0.0) -> dict[str, Any]:
    """A request of the read-only counting tool: it appends ``key`` to ``count_file``."""
    arguments: dict[str, Any] = {"path": str(count_file), "key": key}
    if sleep_s:
        arguments["sleep_s"] = sleep_s
    return {"skill": "test/batch", "tool": "test/tally", "arguments": arguments}


def runs_per_key(count_file: Path) -> Counter[str]:
    if not count_file.exists():
        return Counter()
    return Counter(count_file.read_text(encoding="utf-8").split())


def stored_results(redis_url: str) -> int:
    """How many invocation results the result backend holds."""
    client = redis.Redis.from_url(redis_url)
    try:
        return len(client.keys("celery-task-meta-*"))
    finally:
        client.close()


# --- ordered output and exit codes -------------------------------------------------------


def test_a_mixed_batch_writes_one_result_per_line_in_input_order_and_exits_1(
    broker: Broker, start_worker: StartWorker, tmp_path: Path
) -> None:
    start_worker(broker)
    batch = write_jsonl(tmp_path / "mixed.jsonl", [line for line, _ in MIXED])
    out = tmp_path / "out.jsonl"

    done = run_cli("batch", "run", str(batch), "--out", str(out), env=cli_env(**broker.env))

    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    results = read_results(out)
    assert len(results) == len(MIXED)
    for payload, (line, expected) in zip(results, MIXED, strict=True):
        assert set(payload) == RESULT_FIELDS
        assert payload["skill_name"] == line["skill"]
        assert payload["tool_name"] == line["tool"]
        assert payload["success"] is (expected is None), payload
        assert error_type(payload) == expected, payload
    assert results[0]["output_data"] == {"text": "first"}
    assert results[-1]["output_data"] == {"text": "last"}
    assert len({p["request_id"] for p in results}) == len(MIXED)
    assert not Path("/nonexistent/never-written").exists()


def test_an_all_successful_batch_exits_0(
    redis_url: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    start_worker(redis_url)
    texts = [f"t{i}" for i in range(30)]
    batch = write_jsonl(
        tmp_path / "ok.jsonl",
        [{"skill": "test/basic", "tool": "test/echo", "arguments": {"text": t}} for t in texts],
    )
    out = tmp_path / "out.jsonl"

    done = run_cli("batch", "run", str(batch), "--out", str(out), env=cli_env(redis_url))

    assert done.returncode == 0, done.stderr
    assert [p["output_data"]["text"] for p in read_results(out)] == texts


@pytest.mark.parametrize("spelling", ["same", "another path to it", "a hard link"])
def test_out_may_not_be_the_input_file(tmp_path: Path, spelling: str) -> None:
    # Opening --out truncates it: were it the input, the requests would be gone
    batch = write_jsonl(tmp_path / "requests.jsonl", [tally_line(tmp_path / "count", "a")])
    before = batch.read_text(encoding="utf-8")
    (tmp_path / "sub").mkdir()
    out = {
        "same": str(batch),
        "another path to it": str(tmp_path / "sub" / ".." / "requests.jsonl"),
        "a hard link": str(tmp_path / "linked.jsonl"),
    }[spelling]
    if spelling == "a hard link":
        os.link(batch, out)

    done = run_cli("batch", "run", str(batch), "--out", out, env=cli_env())

    assert done.returncode == 2, done.stderr
    assert "--out" in done.stderr
    assert "Traceback" not in done.stderr
    assert batch.read_text(encoding="utf-8") == before


def test_an_out_file_that_cannot_be_written_is_bad_usage_and_runs_nothing(
    tmp_path: Path,
) -> None:
    count_file = tmp_path / "count"
    batch = write_jsonl(tmp_path / "requests.jsonl", [tally_line(count_file, "a")])
    out = tmp_path / "missing" / "out.jsonl"

    done = run_cli("batch", "run", str(batch), "--out", str(out), env=cli_env())

    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        f"error: cannot write --out {out}: No such file or directory; create its folder first"
    )
    assert not count_file.exists()


# --- bad lines ---------------------------------------------------------------------------


def _file_with_bad_lines(tmp_path: Path, count_file: Path) -> tuple[Path, list[str | None]]:
    """Good counting lines around three bad ones; returns the file and each line's bad kind."""
    lines: list[dict[str, Any] | str] = [
        tally_line(count_file, "a"),
        "{this is not json",  # line 2
        tally_line(count_file, "b"),
        '["a", "json", "array"]',  # line 4
        {"skill": "test/batch", "arguments": {}},  # line 5: no tool
        tally_line(count_file, "c"),
        # line 7: JSON nested past what a parser's stack takes
        '{"skill": "test/batch", "tool": "test/tally", "arguments": {"a": '
        + "[" * 100_000 + "]" * 100_000 + "}}",
        # line 8: valid JSON, arguments nested past the depth limit
        '{"skill": "test/batch", "tool": "test/tally", "arguments": {"a": '
        + "[" * 500 + "]" * 500 + "}}",
        # lines 9-12: half a surrogate pair (a valid JSON escape, not Unicode) in an
        # argument, an argument's name, the skill's name, the request id
        '{"skill": "test/batch", "tool": "test/tally", "arguments": {"key": "\\ud800"}}',
        '{"skill": "test/batch", "tool": "test/tally", "arguments": {"\\udfff": 1}}',
        '{"skill": "test/\\udc00", "tool": "test/tally", "arguments": {}}',
        '{"request_id": "r-\\ud800", "skill": "test/batch", "tool": "test/tally"}',
        # line 13: longer than a line may be (read past, never held whole)
        tally_line(count_file, "x" * MAX_LINE_CHARS),
        tally_line(count_file, "d"),
    ]
    kinds = [None, "bad", None, "bad", "bad", None, "bad", "bad", "bad", "bad", "bad", "bad"]
    kinds += ["bad", None]
    return write_jsonl(tmp_path / "bad.jsonl", lines), kinds


def test_bad_lines_are_reported_with_their_numbers_and_the_others_still_run(
    redis_url: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    start_worker(redis_url)
    count_file = tmp_path / "count"
    batch, kinds = _file_with_bad_lines(tmp_path, count_file)
    out = tmp_path / "out.jsonl"

    done = run_cli("batch", "run", str(batch), "--out", str(out), env=cli_env(redis_url))

    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    for number in (2, 4, 5, 7, 8, 9, 10, 11, 12, 13):
        assert f"line {number}:" in done.stderr
    for number in (1, 3, 6, 14):
        assert f"line {number}:" not in done.stderr
    results = read_results(out)
    assert len(results) == len(kinds)
    for number, (payload, kind) in enumerate(zip(results, kinds, strict=True), 1):
        if kind is None:
            assert payload["success"] is True, payload
        else:
            assert error_type(payload) == "validation_error", payload
            assert payload["error"]["details"]["line"] == number
    assert [p["output_data"]["key"] for p in results if p["success"]] == ["a", "b", "c", "d"]
    assert runs_per_key(count_file) == Counter({"a": 1, "b": 1, "c": 1, "d": 1})


def test_strict_runs_nothing_when_a_line_is_bad(
    redis_url: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    start_worker(redis_url, concurrency=1)
    count_file = tmp_path / "count"
    batch, _ = _file_with_bad_lines(tmp_path, count_file)
    out = tmp_path / "out.jsonl"

    done = run_cli(
        "batch", "run", str(batch), "--out", str(out), "--strict", env=cli_env(redis_url)
    )

    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    for number in (2, 4, 5, 7, 8, 9, 10, 11, 12, 13):
        assert f"line {number}:" in done.stderr
    # Then nothing ran: a batch run after it is answered only once whatever was queued
    # before it has run (the worker has one process; reads go first, then the batch
    # queue in order)
    after_count = tmp_path / "after-count"
    after = write_jsonl(tmp_path / "after.jsonl", [tally_line(after_count, "after")])
    done = run_cli(
        "batch", "run", str(after), "--out", str(tmp_path / "after-out.jsonl"),
        env=cli_env(redis_url),
    )
    assert done.returncode == 0, done.stderr
    assert runs_per_key(after_count) == Counter({"after": 1})
    assert not count_file.exists()
    assert stored_results(redis_url) == 1  # the later run's own


# --- request ids and resuming ------------------------------------------------------------


def test_lines_without_request_id_get_the_same_ids_on_every_run(
    redis_url: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    start_worker(redis_url)
    count_file = tmp_path / "count"
    keys = [f"k{i}" for i in range(20)]
    batch = write_jsonl(tmp_path / "ids.jsonl", [tally_line(count_file, k) for k in keys])
    env = cli_env(redis_url)

    first = run_cli("batch", "run", str(batch), "--out", str(tmp_path / "one.jsonl"), env=env)
    # The same file named by a relative path from elsewhere is still the same file.
    second = run_cli("batch", "run", batch.name, "--out", "two.jsonl", env=env, cwd=tmp_path)

    assert first.returncode == 0, first.stderr
    assert second.returncode == 0, second.stderr
    one, two = read_results(tmp_path / "one.jsonl"), read_results(tmp_path / "two.jsonl")
    ids = [p["request_id"] for p in one]
    assert len(set(ids)) == len(keys)
    assert [p["request_id"] for p in two] == ids
    assert [p["output_data"]["key"] for p in two] == keys
    # The second run reused the stored results: nothing ran twice.
    assert runs_per_key(count_file) == Counter(dict.fromkeys(keys, 1))


def _resume_file(tmp_path: Path, count_file: Path, n: int) -> tuple[Path, list[str]]:
    keys = [f"r{i:04d}" for i in range(n)]
    lines = [tally_line(count_file, key, sleep_s=0.02) for key in keys]
    return write_jsonl(tmp_path / "resume.jsonl", lines), keys


def _start_run(batch: Path, out: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cleveragents",
            "batch",
            "run",
            str(batch),
            "--out",
            str(out),
            "--chunk-size",
            "25",
        ],
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _assert_complete_and_once(out: Path, count_file: Path, keys: list[str]) -> None:
    results = read_results(out)
    assert len(results) == len(keys)
    assert all(p["success"] for p in results)
    assert [p["output_data"]["key"] for p in results] == keys
    runs = runs_per_key(count_file)
    twice = {key: n for key, n in runs.items() if n != 1}
    assert not twice, f"ran more than once: {twice}"
    assert set(runs) == set(keys)


def test_a_killed_run_resumes_without_running_stored_requests_again(
    broker: Broker, start_worker: StartWorker, tmp_path: Path
) -> None:
    redis_url = broker.backend  # where the results are stored
    start_worker(broker, concurrency=2)
    count_file = tmp_path / "count"
    batch, keys = _resume_file(tmp_path, count_file, 300)
    out = tmp_path / "out.jsonl"
    env = cli_env(**broker.env)

    # Given a run killed (with everything it started) once some results are stored
    run = _start_run(batch, out, env)
    try:
        wait_until(lambda: stored_results(redis_url) >= 40, 30, "some stored results")
    finally:
        kill_group(run)
        run.wait(10)
    stopped_at = stored_results(redis_url)
    assert stopped_at < len(keys), "the run finished before it could be killed: make it slower"
    # and the workers left to finish what was submitted
    wait_until(lambda: stored_results(redis_url) >= len(keys), 60, "the workers to drain")

    # When the same command runs again
    again = run_cli("batch", "run", str(batch), "--out", str(out), "--chunk-size", "25", env=env)

    # Then every line has its result and no request ran twice
    assert again.returncode == 0, again.stderr
    _assert_complete_and_once(out, count_file, keys)
    print(f"killed after {stopped_at} stored results; {len(keys)} after the rerun")


def test_a_resumed_run_runs_only_what_is_missing_when_queued_work_was_lost(
    redis_url: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    worker = start_worker(redis_url, concurrency=2)
    count_file = tmp_path / "count"
    batch, keys = _resume_file(tmp_path, count_file, 300)
    out = tmp_path / "out.jsonl"
    env = cli_env(redis_url)

    # Given a run killed mid-way, its worker shut down warmly (running tools finish and
    # store their results), and everything still queued lost
    run = _start_run(batch, out, env)
    try:
        wait_until(lambda: stored_results(redis_url) >= 40, 30, "some stored results")
    finally:
        kill_group(run)
        run.wait(10)
    assert worker.proc is not None
    os.kill(worker.proc.pid, signal.SIGTERM)
    worker.proc.wait(60)  # a warm shutdown: more than 30 s once, on a loaded machine
    broker = redis.Redis.from_url(redis_url)
    lost = [k for k in broker.keys("skills.batch*") if broker.type(k) == b"list"]
    broker.delete(*lost, "unacked", "unacked_index")
    broker.close()
    stored = stored_results(redis_url)
    assert 0 < stored < len(keys), "the run finished before it could be killed: make it slower"
    assert sum(runs_per_key(count_file).values()) == stored

    # When the same command runs again with a new worker
    start_worker(redis_url, concurrency=2)
    again = run_cli("batch", "run", str(batch), "--out", str(out), "--chunk-size", "25", env=env)

    # Then the missing requests ran, once each, and the stored ones were reused
    assert again.returncode == 0, again.stderr
    _assert_complete_and_once(out, count_file, keys)
    assert "reused from an earlier run" in again.stderr
    reused_row = next(r for r in again.stderr.splitlines() if "reused from an earlier run" in r)
    assert str(stored) in reused_row
    print(f"{stored} results survived; the rerun ran the other {len(keys) - stored}")


# --- allow_writes ------------------------------------------------------------------------


def _write_line(counter: Path) -> dict[str, Any]:
    return {
        "skill": "test/basic",
        "tool": "test/count-write",
        "arguments": {"path": str(counter)},
        "allow_writes": True,
    }


def test_allow_writes_on_a_line_counts_only_with_the_flag(
    redis_url: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    start_worker(redis_url)
    counter = tmp_path / "written"
    env = cli_env(redis_url)
    without = write_jsonl(tmp_path / "without.jsonl", [_write_line(counter)])
    with_flag = write_jsonl(tmp_path / "with.jsonl", [_write_line(counter)])

    refused = run_cli("batch", "run", str(without), "--out", str(tmp_path / "a.jsonl"), env=env)
    assert refused.returncode == 1, refused.stderr
    [payload] = read_results(tmp_path / "a.jsonl")
    assert error_type(payload) == "permission_denied"
    assert not counter.exists()

    allowed = run_cli(
        "batch",
        "run",
        str(with_flag),
        "--out",
        str(tmp_path / "b.jsonl"),
        "--allow-writes",
        env=env,
    )
    assert allowed.returncode == 0, allowed.stderr
    [payload] = read_results(tmp_path / "b.jsonl")
    assert payload["success"] is True, payload
    assert payload["resource_changes"] == [{"action": "changed", "resource": str(counter)}]
    assert counter.read_text() == "ran\n"


def test_rerunning_with_allow_writes_after_a_refused_run_runs_the_write(
    redis_url: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    start_worker(redis_url)
    counter = tmp_path / "written"
    env = cli_env(redis_url)
    batch = write_jsonl(tmp_path / "writes.jsonl", [_write_line(counter)])
    out = tmp_path / "out.jsonl"

    refused = run_cli("batch", "run", str(batch), "--out", str(out), env=env)
    assert refused.returncode == 1
    allowed = run_cli("batch", "run", str(batch), "--out", str(out), "--allow-writes", env=env)

    [payload] = read_results(out)
    assert payload["success"] is True, payload
    assert allowed.returncode == 0
    assert counter.read_text() == "ran\n"


# --- the embedded default ----------------------------------------------------------------


def test_the_example_batch_runs_on_the_embedded_default_with_no_server(tmp_path: Path) -> None:
    # Given no broker at all: only a home folder, and a working folder with no skills/
    batch = shutil.copy(REPO / "examples" / "batch.jsonl", tmp_path / "batch.jsonl")
    expected = [json.loads(line) for line in Path(batch).read_text().splitlines()]
    out = tmp_path / "out.jsonl"
    env = cli_env(CLEVERAGENTS_HOME=str(tmp_path / "home"))

    done = run_cli("batch", "run", "batch.jsonl", "--out", str(out), env=env, cwd=tmp_path)

    # Then every line has its result in order; ex-5 is invalid on purpose (text: 42)
    assert done.returncode == 1, done.stderr
    results = read_results(out)
    assert [p["request_id"] for p in results] == [line["request_id"] for line in expected]
    assert [p["request_id"] for p in results] == ["ex-1", "ex-2", "ex-3", "ex-4", "ex-5"]
    assert [p["success"] for p in results] == [True, True, True, True, False]
    assert error_type(results[4]) == "validation_error"
    assert results[0]["output_data"] == {"words": 4}
    assert results[1]["output_data"] == {"text": "HELLO"}
    for payload, line in zip(results, expected, strict=True):
        assert set(payload) == RESULT_FIELDS
        assert (payload["skill_name"], payload["tool_name"]) == (line["skill"], line["tool"])
    # And a command that starts the local worker as root says, once, who its tools run as
    said = "note: the local worker runs as root, so command tools and MCP servers run as 'nobody'"
    assert done.stderr.count(said) == (1 if os.geteuid() == 0 else 0), done.stderr


def _waiting_messages(home: Path) -> list[Path]:
    broker = home / "broker"
    return list((broker / "queue").glob("*.msg")) + list((broker / "inflight").glob("*/*.msg"))


def test_ctrl_c_on_the_embedded_default_says_what_stopped_and_leaves_nothing_queued(
    tmp_path: Path,
) -> None:
    count_file = tmp_path / "count"
    batch, keys = _resume_file(tmp_path, count_file, 300)
    out = tmp_path / "out.jsonl"
    home = tmp_path / "home"
    env = cli_env(CLEVERAGENTS_HOME=str(home), CLEVERAGENTS_CATALOGUE=str(FIXTURE_SKILLS))

    # Given a batch run on the embedded default, interrupted as a terminal's Ctrl-C does
    run = subprocess.Popen(
        [sys.executable, "-m", "cleveragents", "batch", "run", str(batch), "--out", str(out),
         "--chunk-size", "25"],
        env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        wait_until(lambda: len(runs_per_key(count_file)) >= 30, 60, "some lines to run")
        local_worker = HomeShare(home).read()  # the worker the command started, by its PID
        assert local_worker is not None
        os.killpg(run.pid, signal.SIGINT)
        _, stderr = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            kill_group(run)
    text = stderr.decode()

    # Then it says the local worker stopped (nothing keeps running), and nothing waits on disk
    assert run.returncode == 130, text
    assert "the local worker stopped, and what it had not run was taken off the queue" in text
    assert "keeps running" not in text
    assert _waiting_messages(home) == []
    ran = len(runs_per_key(count_file))
    assert ran < len(keys), "the run finished before it could be interrupted: make it slower"
    # Every process of the local worker (its pool, and the tools in it) is gone: nothing
    # is left that could run a line
    wait_until(lambda: not group_alive(local_worker.pid), 10, "the local worker to be gone")
    assert len(runs_per_key(count_file)) == ran, "work went on after the interrupt"

    # When the same command runs again, it completes, runs nothing twice, leaves nothing behind
    again = run_cli("batch", "run", str(batch), "--out", str(out), "--chunk-size", "25",
                    env=env, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    _assert_complete_and_once(out, count_file, keys)
    assert _waiting_messages(home) == []


def test_ctrl_c_is_answered_whenever_it_comes_even_pressed_again_and_again(
    redis_url: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    start_worker(redis_url)
    server = redis.Redis.from_url(redis_url)
    answered = []
    for attempt in range(3):
        lines = [
            {"skill": "test/basic", "tool": "test/echo", "arguments": {"text": f"c{attempt}.{i}"}}
            for i in range(400)
        ]
        batch = write_jsonl(tmp_path / f"late-{attempt}.jsonl", lines)
        out = tmp_path / f"late-{attempt}.out.jsonl"
        run = subprocess.Popen(
            [sys.executable, "-m", "cleveragents", "batch", "run", str(batch), "--out", str(out)],
            env=cli_env(redis_url), cwd=tmp_path, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        stored = 400 * attempt + 100  # a quarter of this batch's results
        try:
            # Given a batch under way: a person presses Ctrl-C, again and again, until it
            # ends (where one lands in the command's last phase is timing's: the
            # Interrupts tests below take each phase in turn)
            wait_until(
                lambda n=stored, run=run: run.poll() is not None
                or sum(1 for _ in server.scan_iter("celery-task-meta-*", count=1000)) >= n,
                60,
                "results stored",
            )
            while run.poll() is None:
                run.send_signal(signal.SIGINT)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    run.wait(0.02)
            _, stderr = run.communicate(timeout=60)
        finally:
            if run.poll() is None:
                kill_group(run)
        text = stderr.decode()
        # Then it says what the signal found, exits 130, and never breaks into a traceback
        assert "Traceback" not in text, text
        assert "Aborted!" not in text, text
        if run.returncode == 0:
            continue  # it had ended before the first signal came
        assert run.returncode == 130, text
        stopped = "interrupted: " in text and "Run the same command again to resume" in text
        finished = (
            f"interrupted as the batch finished: all 400 results were already written to {out}"
            in text
        )
        assert stopped or finished, text
        answered.append("finished" if finished else "stopped")
    assert answered, "every run ended before its first Ctrl-C: make the batch longer"


def test_the_progress_bar_counts_lines_finished_in_any_order_and_says_what_is_written(
    redis_url: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    start_worker(redis_url)
    # Given a batch whose first line runs for seconds and whose others are quick
    lines: list[dict[str, Any]] = [
        {"skill": "local/common", "tool": "local/sleep", "arguments": {"seconds": 4}}
    ]
    lines += [
        {"skill": "local/common", "tool": "local/echo", "arguments": {"text": f"p{i}"}}
        for i in range(599)
    ]
    batch = write_jsonl(tmp_path / "slow-first.jsonl", lines)
    # When it runs with its progress bar drawn (as on a terminal)
    done = run_cli(
        "batch", "run", str(batch), "--out", str(tmp_path / "out.jsonl"), "--chunk-size", "20",
        env=cli_env(redis_url, FORCE_COLOR="1", COLUMNS="200", TERM="xterm"),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    drawn = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", done.stderr)
    frames = re.findall(r"(\d+)/600 .*?written (\d+)", drawn)
    # Then, while the first line still ran, the bar showed the other lines done, and
    # none written: their turn had not come
    assert any(int(n) >= 300 and written == "0" for n, written in frames), frames[-20:]
    assert frames[-1] == ("600", "600")


def _ctrl_c() -> None:
    """A Ctrl-C to this process, its handler run before this returns."""
    os.kill(os.getpid(), signal.SIGINT)
    # Ends as the handler raises (the signal interrupts the sleep): 0.5 s is only its bound
    time.sleep(0.5)


def test_interrupts_stop_a_run_once_then_count_and_leave_the_exit_code_alone() -> None:
    previous = signal.getsignal(signal.SIGINT)
    try:
        # While results are awaited, the first Ctrl-C stops the run
        interrupts = Interrupts.install()
        with pytest.raises(KeyboardInterrupt):
            _ctrl_c()
        # And the next ones, as its message is written, only count
        os.kill(os.getpid(), signal.SIGINT)
        assert interrupts.count == 2
        assert interrupts.settle() is True  # said as late: it found the run stopping
        # Once settled (the command exits), a Ctrl-C is ignored: the exit code stands
        os.kill(os.getpid(), signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN

        # Once every result is written, a Ctrl-C stops nothing and is said at the end
        finished = Interrupts.install()
        finished.finishing()
        os.kill(os.getpid(), signal.SIGINT)
        assert finished.settle() is True
        # And a run nobody interrupted says nothing
        quiet = Interrupts.install()
        quiet.finishing()
        assert quiet.settle() is False
    finally:
        signal.signal(signal.SIGINT, previous)


# --- background batches ------------------------------------------------------------------


def test_submit_returns_at_once_then_status_and_results_follow_the_batch(
    redis_url: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    env = cli_env(redis_url)
    texts = [f"s{i}" for i in range(40)]
    lines: list[dict[str, Any]] = [
        {"skill": "test/basic", "tool": "test/echo", "arguments": {"text": t}} for t in texts
    ]
    lines.insert(17, {"skill": "test/basic", "tool": "test/crash"})
    lines.insert(30, {"skill": "test/basic"})  # no tool: refused before sending
    batch = write_jsonl(tmp_path / "bg.jsonl", lines)

    # Given no worker yet: submit does not wait for one
    submitted = run_cli("batch", "submit", str(batch), "--json", env=env, timeout=30)
    assert submitted.returncode == 0, submitted.stderr
    answer = json.loads(submitted.stdout)
    assert set(answer) == {"batch_id", "total"}
    assert answer["total"] == len(lines)
    batch_id = answer["batch_id"]

    waiting = run_cli("batch", "status", batch_id, "--json", env=env)
    assert waiting.returncode == 1  # not done yet
    # but its invalid line is answered already (kept in the batch's ledger)
    assert json.loads(waiting.stdout)["done"] == 1

    # When a worker comes
    start_worker(redis_url)

    def status() -> dict[str, Any]:
        done = run_cli("batch", "status", batch_id, "--json", env=env)
        assert done.returncode in (0, 1), done.stderr
        return dict(json.loads(done.stdout))

    wait_until(lambda: status()["done"] == len(lines), 60, "the batch to finish", interval=0.2)
    final = status()
    assert final["total"] == final["done"] == len(lines)
    assert final["succeeded"] == len(texts)
    assert final["failed"] == 2
    assert final["failed_by_type"] == {"tool_execution_failure": 1, "validation_error": 1}

    out = tmp_path / "results.jsonl"
    fetched = run_cli("batch", "results", batch_id, "--out", str(out), env=env)
    assert fetched.returncode == 1, fetched.stderr  # one invocation failed
    results = read_results(out)
    assert len(results) == len(lines)
    assert error_type(results[17]) == "tool_execution_failure"
    assert error_type(results[30]) == "validation_error"
    assert [p["output_data"]["text"] for p in results if p["success"]] == texts
    assert all(set(p) == RESULT_FIELDS for p in results)


@pytest.mark.parametrize("command", ["status", "results"])
def test_an_unknown_batch_id_exits_2(redis_url: str, tmp_path: Path, command: str) -> None:
    args = ["batch", command, "no-such-batch"]
    if command == "results":
        args += ["--out", str(tmp_path / "out.jsonl")]
    done = run_cli(*args, env=cli_env(redis_url))
    assert done.returncode == 2
    assert "no-such-batch" in done.stderr
    assert "Traceback" not in done.stderr
