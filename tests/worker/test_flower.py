"""Flower against a real worker: invocations with name, skill, tool, state; arguments redacted.

A batch shows as its chunks (``skills.invoke_chunk``: skill and tool, batch id, which
items, how many failed) plus one failed ``skills.invoke`` row per failed invocation.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cleveragents.client import SkillClient
from cleveragents.messages import ChunkContext, chunk_repr, redacted_repr
from cleveragents.pipeline import ItemFailure, Pipeline, execute_chunk
from cleveragents.skills import Catalogue
from cleveragents.stores import Stores
from cleveragents.tasks.events import task_events_on
from tests.support.procs import FIXTURE_SKILLS, REPO, Worker, free_port, kill_group, wait_until

pytestmark = pytest.mark.timeout(180)

SECRET = "sk-flower-secret-4242"


@pytest.fixture
def flower(redis_url: str) -> Iterator[str]:
    """``celery -A worker flower`` on a free port; its base URL."""
    port = free_port()
    env = {
        **os.environ,
        "CLEVERAGENTS_BROKER_URL": redis_url,
        "FLOWER_UNAUTHENTICATED_API": "true",
        "PYTHONPATH": str(REPO),
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "worker",
            "flower",
            f"--port={port}",
            "--address=127.0.0.1",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _get(f"{base}/healthcheck") is not None, 30, "flower up")
        yield base
    finally:
        kill_group(proc)
        proc.wait(10)


def _get(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            body = response.read().decode()
    except OSError:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return body


def test_flower_lists_invocations_with_states_and_redacted_arguments(
    flower: str,
    client: SkillClient,
    redis_url: str,
    start_worker: Callable[..., Worker],
) -> None:
    start_worker(redis_url)
    ok = client.submit("local/text-tools", "local/word-count", {"text": f"a {SECRET}"})
    bad = client.submit("test/basic", "test/crash")
    invalid = client.submit("local/text-tools", "local/word-count", {"text": ["x", SECRET]})
    assert ok.result(timeout=30).success
    assert not bad.result(timeout=30).success
    assert not invalid.result(timeout=30).success

    def both_done() -> bool:
        tasks = _get(f"{flower}/api/tasks") or {}
        ids = (ok.request_id, bad.request_id, invalid.request_id)
        states = [tasks.get(i, {}).get("state") for i in ids]
        return states == ["SUCCESS", "FAILURE", "FAILURE"]

    wait_until(both_done, 30, "flower to see both invocations finish")
    tasks = _get(f"{flower}/api/tasks")
    seen_ok, seen_bad = tasks[ok.request_id], tasks[bad.request_id]
    assert seen_ok["name"] == seen_bad["name"] == "skills.invoke"
    # Skill and tool come first: the start of the args column is what the tasks page shows
    assert seen_ok["args"].startswith("local/text-tools local/word-count(text=[redacted])")
    assert seen_bad["args"].startswith("test/basic test/crash()")
    assert "local/text-tools" in seen_ok["args"]
    assert "local/word-count" in seen_ok["args"]
    assert "test/basic" in seen_bad["args"]
    assert "test/crash" in seen_bad["args"]
    assert "[redacted]" in seen_ok["args"]
    assert "'words': 2" in (seen_ok["result"] or "")
    assert "tool_execution_failure" in seen_bad["exception"]
    assert "the tool crashed" in seen_bad["exception"]
    assert "validation_error" in tasks[invalid.request_id]["exception"]
    # A failed invocation shows no traceback: it is the tool's failure, not a crash
    assert not seen_bad.get("traceback"), seen_bad.get("traceback")
    assert not tasks[invalid.request_id].get("traceback")
    page = json.dumps(tasks) + str(_get(f"{flower}/api/task/info/{invalid.request_id}"))
    assert SECRET not in page
    # The client still gets everything (the tool echoes nothing secret here, but the
    # request's arguments were delivered whole: the word count saw both words).
    assert ok.result(timeout=5).output_data == {"words": 2}


#: The batch id the batch tests give their run, to find its rows in Flower.
BATCH_ID = "flower-batch-7"


def _batch_requests(prefix: str) -> list[dict[str, Any]]:
    """Seven requests: four succeed; three fail in the worker, each in its own way."""

    def count(n: int) -> dict[str, Any]:
        return {"request_id": f"{prefix}-ok-{n}", "skill": "local/text-tools",
                "tool": "local/word-count", "arguments": {"text": f"a b {SECRET}"}}

    return [
        count(1),
        {"request_id": f"{prefix}-crash", "skill": "test/basic", "tool": "test/crash",
         "arguments": {}},
        count(3),
        {"request_id": f"{prefix}-invalid", "skill": "local/text-tools",
         "tool": "local/word-count", "arguments": {"text": ["x", SECRET]}},
        count(5),
        count(6),
        {"request_id": f"{prefix}-unknown", "skill": "local/no-such-skill",
         "tool": "local/none", "arguments": {"token": SECRET}},
    ]


#: The failed requests of ``_batch_requests``: id suffix, item number, skill, tool, error type.
BATCH_FAILURES = [
    ("crash", 2, "test/basic", "test/crash", "tool_execution_failure"),
    ("invalid", 4, "local/text-tools", "local/word-count", "validation_error"),
    ("unknown", 7, "local/no-such-skill", "local/none", "skill_not_found"),
]


def _run_batch(client: SkillClient, prefix: str) -> None:
    requests = _batch_requests(prefix)
    results = list(client.batches.run_many(requests, chunk_size=3, batch_id=BATCH_ID))
    assert [r.success for r in results] == [True, False, True, False, True, True, False]


def _batch_rows_done(flower: str, prefix: str) -> bool:
    tasks = _get(f"{flower}/api/tasks") or {}
    failed = [tasks.get(f"{prefix}-{suffix}", {}).get("state") for suffix, *_ in BATCH_FAILURES]
    chunks = [t for t in tasks.values() if t.get("name") == "skills.invoke_chunk"]
    return failed == ["FAILURE"] * 3 and [c["state"] for c in chunks] == ["SUCCESS"] * 3


def test_flower_shows_each_failed_batch_invocation_as_its_own_failed_row(
    flower: str,
    client: SkillClient,
    redis_url: str,
    start_worker: Callable[..., Worker],
) -> None:
    # Given a worker, and a batch of seven in chunks of three, three of which fail
    start_worker(redis_url)
    _run_batch(client, "fb")

    # When Flower has seen the batch
    wait_until(lambda: _batch_rows_done(flower, "fb"), 30, "flower to see the batch's rows")
    tasks = _get(f"{flower}/api/tasks")

    # Then each failed invocation is its own failed row: skill and tool first, the batch
    # and the item it was, and its error type
    for suffix, item, skill, tool, error_type in BATCH_FAILURES:
        row = tasks[f"fb-{suffix}"]
        assert row["name"] == "skills.invoke"
        assert row["state"] == "FAILURE"
        assert row["args"].startswith(f"{skill} {tool}("), row["args"]
        assert f"batch {BATCH_ID} · item {item} of 7" in row["args"], row["args"]
        assert row["exception"].startswith("SkillInvocationFailed("), row["exception"]
        assert f"{error_type}: " in row["exception"], row["exception"]
        assert row["worker"], row
        assert all(row[when] for when in ("received", "started", "failed")), row
    # And each chunk row names what it runs, its batch, its items and how many failed
    chunks = sorted(
        (t for t in tasks.values() if t["name"] == "skills.invoke_chunk"),
        key=lambda t: t["args"].split("items ")[-1],
    )
    assert [c["args"] for c in chunks] == [
        f"local/text-tools local/word-count x2, test/basic test/crash x1 · batch {BATCH_ID} "
        "· items 1-3 of 7",
        f"local/text-tools local/word-count x3 · batch {BATCH_ID} · items 4-6 of 7",
        f"local/no-such-skill local/none x1 · batch {BATCH_ID} · item 7 of 7",
    ]
    # And its result says where it is in the batch first, then what it did
    assert [c["result"] for c in chunks] == [
        f"{{'batch': '{BATCH_ID}', 'items': '{items} of 7', 'invocations': {n}, 'ran': {n}, "
        f"'skipped': 0, 'failed': 1, 'requeued': 0}}"
        for items, n in (("1-3", 3), ("4-6", 3), ("7", 1))
    ]
    # And successes stay in their chunk's counts: no row of their own
    assert not [rid for rid in tasks if rid.startswith("fb-ok-")]
    # And no argument value shows anywhere, in the list or on a task's page
    pages = [_get(f"{flower}/api/task/info/fb-{suffix}") for suffix, *_ in BATCH_FAILURES]
    assert SECRET not in json.dumps(tasks) + json.dumps(pages)


def test_a_chunk_reports_each_failed_invocation_once_its_result_is_stored() -> None:
    # Given a chunk of three on the in-memory stores: one succeeds, two fail
    stores = Stores.in_memory()
    pipeline = Pipeline.over(Catalogue.from_paths(FIXTURE_SKILLS), stores)
    bodies = [
        {"request_id": "u-1", "skill": "test/basic", "tool": "test/echo",
         "arguments": {"text": "a"}},
        {"request_id": "u-2", "skill": "test/basic", "tool": "test/crash"},
        {"request_id": "u-3", "skill": "test/nope", "tool": "test/none"},
    ]
    seen: list[tuple[int, str, str, bool]] = []

    def report(failures: list[ItemFailure]) -> None:
        for f in failures:
            [payload] = stores.results.get_payloads([f.request_id])
            error = f.result.error.error_type if f.result.error else ""
            seen.append((f.index, f.request_id, error, payload is not None))

    # When it runs
    execute_chunk(pipeline, bodies, chunk_id="c-1", redelivered=False,
                  requeue=lambda rest, start, rest_id: None, report_failures=report)

    # Then the failures, and only they, are reported with their place, after being stored
    assert seen == [(1, "u-2", "tool_execution_failure", True), (2, "u-3", "skill_not_found", True)]


def test_a_worker_sends_item_rows_only_while_it_sends_task_events() -> None:
    # The rule Celery's own event dispatcher applies to every task event: enabled, and
    # the "task" group not left out (`celery control disable_events` leaves it out).
    on = SimpleNamespace(enabled=True, groups=set())
    assert task_events_on(on)
    assert task_events_on(SimpleNamespace(enabled=True, groups={"worker", "task"}))
    assert not task_events_on(SimpleNamespace(enabled=True, groups={"worker"}))
    assert not task_events_on(SimpleNamespace(enabled=False, groups=set()))
    assert not task_events_on(None)


def test_rows_never_show_argument_values_nor_what_is_not_a_name() -> None:
    # A request's values stay out; a skill or tool that is not a string is not shown
    shown = redacted_repr({"skill": {"k": SECRET}, "tool": ["t"], "arguments": [SECRET],
                           "request_id": "r", "allow_writes": True, "extra": SECRET})
    assert SECRET not in shown
    assert shown.startswith("[redacted] [redacted]([redacted])")
    assert "allow_writes=True" in shown
    assert "extra=[redacted]" in shown
    # A producer's batch header that is not what ours sends is left out, never shown raw
    for header in ({"id": SECRET * 4, "items": [[1, 2]]}, {"id": f"<{SECRET}>", "items": [[1, 2]]},
                   {"id": "b", "items": "x"}, {"id": "b", "items": [[1, 9]]},
                   {"id": "b", "items": [[2, 1], [1, 3]]}, "junk", None):
        context = ChunkContext.from_header(header, 2)
        assert context is None, header
        assert chunk_repr([{"skill": "s/a", "tool": "s/t"}] * 2, context) == "s/a s/t x2"
    # What ours sends is shown; a total the items do not fit in is left out
    ours = ChunkContext.from_header({"id": "b-1", "items": [[3, 4]], "total": 3}, 2)
    assert ours == ChunkContext("b-1", (3, 4), None)
    shown = chunk_repr([{"skill": "s/a", "tool": "s/t"}] * 2, ours)
    assert shown == "s/a s/t x2 · batch b-1 · items 3-4"
    # An overlong name does not make an overlong row
    assert len(redacted_repr({"skill": "s/" + "x" * 5000, "tool": "t"})) <= 1024


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--virtual-time-budget=10000",
]


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    if CHROMIUM is None:
        why = (
            "chromium is not installed: INSTALL_BROWSER=1 ./scripts/test installs Debian's "
            "chromium package (apt-get, as root), or install it yourself"
        )
        if os.environ.get("CI") == "true":  # CI installs it: a missing browser is a failure
            pytest.fail(why)
        pytest.skip(why)
    profile = tmp_path / "chromium-profile"
    return subprocess.run(
        [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_flower_tasks_page_in_a_real_browser_shows_invocations(
    flower: str,
    client: SkillClient,
    redis_url: str,
    start_worker: Callable[..., Worker],
    tmp_path: Path,
) -> None:
    # Given a worker that ran a successful and a failed invocation, with a secret argument,
    # and a batch of seven in chunks of three, three of which failed
    start_worker(redis_url)
    ok = client.submit("local/text-tools", "local/word-count", {"text": f"one {SECRET}"})
    bad = client.submit("local/text-tools", "local/word-count", {"text": ["x", SECRET]})
    ok.result(timeout=30)
    bad.result(timeout=30)
    _run_batch(client, "page")
    wait_until(
        lambda: (
            {
                (_get(f"{flower}/api/tasks") or {}).get(i, {}).get("state")
                for i in (ok.request_id, bad.request_id)
            }
            == {"SUCCESS", "FAILURE"}
            and _batch_rows_done(flower, "page")
        ),
        30,
        "flower to see both invocations and the batch",
    )
    # When Flower's tasks page is rendered by headless Chromium (JavaScript and all)
    page = _chromium(tmp_path, "--dump-dom", f"{flower}/tasks")
    assert page.returncode == 0, page.stderr[-2000:]
    dom = page.stdout
    # Then both invocations are listed with task name, skill, tool, state; arguments redacted
    for request_id in (ok.request_id, bad.request_id):
        assert request_id in dom
    assert "skills.invoke" in dom
    assert "local/text-tools local/word-count(text=[redacted])" in dom
    assert "SUCCESS" in dom
    assert "FAILURE" in dom
    assert SECRET not in dom
    # And the batch: its chunks with batch id and items, each failed invocation in its own row
    assert "skills.invoke_chunk" in dom
    assert f"batch {BATCH_ID} · items 1-3 of 7" in dom
    for suffix, item, skill, tool, error_type in BATCH_FAILURES:
        assert f"page-{suffix}" in dom
        assert f"{skill} {tool}(" in dom
        assert f"batch {BATCH_ID} · item {item} of 7" in dom
        assert f"{error_type}: " in dom
    assert "page-ok-" not in dom
    # And a screenshot of the page can be taken (the README's picture is made this way:
    # SCREENSHOT_FLOWER_TASKS=docs/img/flower-tasks.png)
    shot = tmp_path / "flower-tasks.png"
    taken = _chromium(tmp_path, "--window-size=1900,760", f"--screenshot={shot}", f"{flower}/tasks")
    assert taken.returncode == 0, taken.stderr[-2000:]
    assert shot.stat().st_size > 10_000
    target = os.environ.get("SCREENSHOT_FLOWER_TASKS")
    if target:
        shutil.copy(shot, target)
