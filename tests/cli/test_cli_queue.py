"""``submit``, ``result`` and the embedded default, through the real console script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from cleveragents.client import SkillClient
from cleveragents.settings import Settings
from tests.conftest import Broker
from tests.support.procs import REPO, Worker, wait_until

pytestmark = pytest.mark.timeout(180)


def run_cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("CLEVERAGENTS_")}
    base["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, "-m", "cleveragents", *args],
        env={**base, **(env or {})},
        cwd=cwd or REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_submit_then_result_through_the_broker(
    broker: Broker, start_worker: Callable[..., Worker]
) -> None:
    start_worker(broker)
    env = broker.env
    submitted = run_cli(
        "submit",
        "local/text-tools",
        "local/word-count",
        "--args",
        '{"text": "a b"}',
        "--request-id",
        "cli-1",
        "--json",
        env=env,
    )
    assert submitted.returncode == 0, submitted.stderr
    assert json.loads(submitted.stdout) == {"request_id": "cli-1"}
    fetched = run_cli("result", "cli-1", "--wait", "--json", env=env)
    assert fetched.returncode == 0, fetched.stderr
    payload = json.loads(fetched.stdout)
    assert payload["request_id"] == "cli-1"
    assert payload["success"] is True
    assert payload["output_data"] == {"words": 2}
    assert set(payload) >= {"skill_name", "tool_name", "error", "duration_ms", "resource_changes"}


def test_a_failed_invocation_exits_1_with_its_error(
    broker: Broker, start_worker: Callable[..., Worker]
) -> None:
    start_worker(broker)
    env = broker.env
    done = run_cli(
        "submit",
        "local/notes",
        "local/write-note",
        "--args",
        '{"name": "n", "text": "t"}',
        "--wait",
        "--json",
        env=env,
    )
    assert done.returncode == 1
    payload = json.loads(done.stdout)
    assert payload["error"]["error_type"] == "permission_denied"
    human = run_cli("result", payload["request_id"], env=env)
    assert human.returncode == 1
    assert "permission_denied" in human.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["submit", "local/text-tools", "local/word-count", "--args", "{not json"],
        ["submit", "local/text-tools", "local/word-count", "--args", "[1, 2]"],
        ["submit", "local/text-tools", "local/word-count", "--request-id", "has space"],
        ["submit", "local/text-tools"],
    ],
)
def test_bad_input_exits_2_with_one_line(redis_url: str, args: list[str]) -> None:
    done = run_cli(*args, env={"CLEVERAGENTS_BROKER_URL": redis_url})
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.strip()


def test_result_of_an_id_never_submitted_says_so(redis_url: str) -> None:
    env = {"CLEVERAGENTS_BROKER_URL": redis_url}
    done = run_cli("result", "never-submitted", "--json", env=env)
    assert done.returncode == 2
    assert json.loads(done.stdout) == {"request_id": "never-submitted", "state": "UNKNOWN"}
    human = run_cli("result", "never-submitted", "--wait", env=env)
    assert human.returncode == 2
    assert "no invocation never-submitted is known" in human.stderr
    assert "nothing was submitted under this id" in human.stderr


def test_result_of_an_id_never_submitted_is_pending_on_rabbitmq(
    rabbit_url: str, redis_url: str
) -> None:
    # RabbitMQ cannot be searched without taking its messages (cleveragents/broker/queue_search.py):
    # an id neither stored nor bound may still wait there, so it is pending, not unknown.
    env = {"CLEVERAGENTS_BROKER_URL": rabbit_url, "CLEVERAGENTS_RESULT_BACKEND": redis_url}
    done = run_cli("result", "never-submitted", "--json", env=env)
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout) == {"request_id": "never-submitted", "state": "PENDING"}


def test_result_of_an_id_still_queued_is_pending(redis_url: str) -> None:
    # A Python client's fresh id is known only to the queue until a worker takes it
    settings = Settings.from_env({"CLEVERAGENTS_BROKER_URL": redis_url})
    with SkillClient(settings=settings) as client:
        handle = client.submit("local/text-tools", "local/word-count", {"text": "a"})
    env = {"CLEVERAGENTS_BROKER_URL": redis_url}
    done = run_cli("result", handle.request_id, "--json", env=env)
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout) == {"request_id": handle.request_id, "state": "PENDING"}
    # and one the CLI sent is bound to its content when sent
    sent = run_cli("submit", "local/text-tools", "local/shout", "--args", '{"text": "x"}',
                   env=env)
    assert sent.returncode == 0, sent.stderr
    later = run_cli("result", sent.stdout.strip(), env=env)
    assert later.returncode == 1
    assert "pending (no result yet)" in later.stderr


def test_the_embedded_default_tells_a_queued_id_from_a_mistyped_one(tmp_path: Path) -> None:
    env = {"CLEVERAGENTS_HOME": str(tmp_path / "home")}
    with SkillClient(settings=Settings.from_env(env)) as client:
        handle = client.submit("local/text-tools", "local/word-count", {"text": "a"})
    queued = run_cli("result", handle.request_id, "--json", env=env, cwd=tmp_path)
    assert queued.returncode == 1, queued.stderr
    assert json.loads(queued.stdout)["state"] == "PENDING"
    typo = run_cli("result", handle.request_id[:-1] + "x", env=env, cwd=tmp_path)
    assert typo.returncode == 2
    assert "nothing was submitted under this id" in typo.stderr


def test_the_embedded_default_runs_an_invocation_with_no_server(tmp_path: Path) -> None:
    # Given no broker configured at all: the home's private server under CLEVERAGENTS_HOME
    env = {"CLEVERAGENTS_HOME": str(tmp_path / "home")}
    done = run_cli(
        "submit",
        "local/text-tools",
        "local/word-count",
        "--args",
        '{"text": "x y z"}',
        "--wait",
        "--json",
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["output_data"] == {"words": 3}
    # A queued invocation waits in the home's server until a worker serves it (the server
    # stops with the last command, its append-only file kept); `result --wait` starts one.
    queued = run_cli(
        "submit",
        "local/text-tools",
        "local/shout",
        "--args",
        '{"text": "hi"}',
        "--request-id",
        "queued-1",
        env=env,
        cwd=tmp_path,
    )
    assert queued.returncode == 0, queued.stderr
    # (and the command says so: nothing serves the home once it has left)
    assert "no worker serves this home now; `cleveragents result queued-1 --wait`" in (
        queued.stderr
    )
    waited = run_cli(
        "result", "queued-1", "--wait", "--wait-timeout", "60", "--json", env=env, cwd=tmp_path
    )
    assert waited.returncode == 0, waited.stderr
    assert json.loads(waited.stdout)["output_data"] == {"text": "HI"}


def test_a_write_waited_for_where_only_read_only_workers_run_says_so(
    redis_url: str, start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    # Given only a read-only worker on the broker
    start_worker(redis_url, read_only=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith("CLEVERAGENTS_")}
    env = {**base, "PYTHONPATH": str(REPO), "CLEVERAGENTS_BROKER_URL": redis_url}

    # When a write is submitted and waited for
    waiting = subprocess.Popen(
        [sys.executable, "-m", "cleveragents", "submit", "local/notes", "local/write-note",
         "--args", '{"name": "n", "text": "t"}', "--allow-writes", "--wait"],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert waiting.stderr is not None
        line = waiting.stderr.readline()  # blocks until the warning (or the end)
    finally:
        waiting.kill()
        waiting.communicate(timeout=10)  # and closes its pipes

    # Then within seconds it says why nothing happens, instead of waiting silently
    assert "the running workers do not consume skills.write" in line
    assert "read-only" in line
    assert "still waiting" in line


def test_result_of_a_cancelled_invocation_says_it_was_cancelled(
    redis_url: str, start_worker: Callable[..., Worker]
) -> None:
    start_worker(redis_url, concurrency=1)
    settings = Settings.from_env({"CLEVERAGENTS_BROKER_URL": redis_url})
    with SkillClient(settings=settings) as client:
        # Given an invocation cancelled while it waits behind a running one
        busy = client.submit("local/common", "local/sleep", {"seconds": 2})
        waiting = client.submit("local/text-tools", "local/word-count", {"text": "a"})
        assert client.revoke(waiting.request_id)
        assert busy.result(timeout=30).success
        wait_until(
            lambda: client.locate(waiting.request_id) == "REVOKED", 30, "the revoke to be stored"
        )
    # When its result is asked for, it says it was cancelled, not that a result is to come
    env = {"CLEVERAGENTS_BROKER_URL": redis_url}
    done = run_cli("result", waiting.request_id, env=env)
    assert done.returncode == 1
    assert f"{waiting.request_id}: cancelled before it ended (revoked)" in done.stderr
    assert "no result yet" not in done.stderr


def test_worker_help_leads_with_ours_then_celerys() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "cleveragents", "worker", "--help"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 0, done.stderr
    ours, _, celerys = done.stdout.partition("Celery's worker options")
    assert ours.startswith("Usage: cleveragents worker [OPTIONS]")
    assert "--log-format [text|json]" in ours
    assert "CLEVERAGENTS_BROKER_URL" in ours
    assert "--concurrency" in celerys
