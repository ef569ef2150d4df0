"""Flower against a real worker: invocations with name, skill, tool, state; arguments redacted."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cleveragents.client import SkillClient
from tests.procs import REPO, Worker, free_port, kill_group, wait_until

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
    assert "local/text-tools" in seen_ok["args"]
    assert "local/word-count" in seen_ok["args"]
    assert "test/basic" in seen_bad["args"]
    assert "test/crash" in seen_bad["args"]
    assert "[redacted]" in seen_ok["args"]
    assert "'words': 2" in (seen_ok["result"] or "")
    assert "tool_execution_failure" in seen_bad["exception"]
    assert "the tool crashed" in seen_bad["exception"]
    assert "validation_error" in tasks[invalid.request_id]["exception"]
    page = json.dumps(tasks) + str(_get(f"{flower}/api/task/info/{invalid.request_id}"))
    assert SECRET not in page
    # The client still gets everything (the tool echoes nothing secret here, but the
    # request's arguments were delivered whole: the word count saw both words).
    assert ok.result(timeout=5).output_data == {"words": 2}


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
        pytest.fail("chromium is not installed (scripts/test installs Debian's chromium package)")
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
    # Given a worker that ran a successful and a failed invocation, with a secret argument
    start_worker(redis_url)
    ok = client.submit("local/text-tools", "local/word-count", {"text": f"one {SECRET}"})
    bad = client.submit("local/text-tools", "local/word-count", {"text": ["x", SECRET]})
    ok.result(timeout=30)
    bad.result(timeout=30)
    wait_until(
        lambda: (
            {
                (_get(f"{flower}/api/tasks") or {}).get(i, {}).get("state")
                for i in (ok.request_id, bad.request_id)
            }
            == {"SUCCESS", "FAILURE"}
        ),
        30,
        "flower to see both invocations",
    )
    # When Flower's tasks page is rendered by headless Chromium (JavaScript and all)
    page = _chromium(tmp_path, "--dump-dom", f"{flower}/tasks")
    assert page.returncode == 0, page.stderr[-2000:]
    dom = page.stdout
    # Then both invocations are listed with task name, skill, tool, state; arguments redacted
    for request_id in (ok.request_id, bad.request_id):
        assert request_id in dom
    assert "skills.invoke" in dom
    assert "local/text-tools" in dom
    assert "local/word-count" in dom
    assert "SUCCESS" in dom
    assert "FAILURE" in dom
    assert "[redacted]" in dom
    assert SECRET not in dom
    # And a screenshot of the page can be taken (the README's picture is made this way)
    shot = tmp_path / "flower-tasks.png"
    taken = _chromium(tmp_path, "--window-size=1900,700", f"--screenshot={shot}", f"{flower}/tasks")
    assert taken.returncode == 0, taken.stderr[-2000:]
    assert shot.stat().st_size > 10_000
    target = os.environ.get("SCREENSHOT_FLOWER_TASKS")
    if target:
        shutil.copy(shot, target)
