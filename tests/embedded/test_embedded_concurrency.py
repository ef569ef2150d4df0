"""Commands and workers sharing one embedded home: real CLI processes, real local workers.

Issue 17: three ``submit --wait`` started together in one folder each started a
local worker; each stopped (killed) its own worker as soon as its own result was
in, losing whatever message of another command that worker had taken, and that
command waited for ever. Now the commands on a home share one local worker, the
last one out stops it, and a message a killed worker held goes back to the queue.
Issue 44: the queue is the home's private server (``cleveragents.embedded.server``),
stopped with the last process that uses it.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cleveragents.broker.redis.liveness import holds_messages
from cleveragents.client import SkillClient
from cleveragents.constants import QUEUE_BATCH, QUEUE_BATCH_WRITE, QUEUE_READ, QUEUE_WRITE
from cleveragents.embedded.runner import LocalWorker, home_client
from cleveragents.embedded.server import join_server, leave_server
from cleveragents.embedded.share import HomeShare, join, leave_last
from cleveragents.settings import Settings
from tests.support.procs import REPO, wait_until

pytestmark = pytest.mark.timeout(150)

#: Every command of the concurrency test must have returned within this many seconds.
ALL_RETURN_WITHIN_S = 60.0


def cli_env(**extra: str) -> dict[str, str]:
    """No broker configured: the embedded default, and none of the caller's settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLEVERAGENTS_")}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


def start_cli(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "cleveragents", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )


def _stat_fields(pid: str) -> list[str]:
    try:
        return Path(f"/proc/{pid}/stat").read_text(errors="replace").rsplit(")", 1)[-1].split()
    except OSError:
        return []


def processes_using(home: Path) -> list[int]:
    """Live processes (not zombies) whose command line or environment names ``home``."""
    marker = str(home.resolve()).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        fields = _stat_fields(entry.name)
        if not fields or fields[0] in ("Z", "X"):
            continue
        try:
            seen = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker in seen:
            found.append(int(entry.name))
    return found


@pytest.fixture
def home_folder(tmp_path: Path) -> Iterator[Path]:
    """An empty working folder; afterwards nothing that names it may keep running."""
    folder = tmp_path / "work"
    folder.mkdir()
    yield folder
    for pid in processes_using(folder):  # only after a failed test: end what it left
        os.kill(pid, signal.SIGKILL)


def messages_left(home: Path) -> dict[str, int]:
    """The messages waiting in the home server's skill queues, or held unacknowledged
    (the server started again from its append-only file if it was stopped)."""
    join_server(home)
    client = home_client(home)
    try:
        queues = (QUEUE_READ, QUEUE_WRITE, QUEUE_BATCH, QUEUE_BATCH_WRITE)
        counts = {queue: int(client.llen(queue)) for queue in queues}
        counts["unacked"] = int(client.hlen("unacked"))
    finally:
        client.close()
        leave_server(home)
    return {name: n for name, n in counts.items() if n}


def finish_all(procs: dict[str, subprocess.Popen[str]], within: float) -> dict[str, float]:
    """Wait for every process; fail naming those still running after ``within`` seconds."""
    started = time.monotonic()
    took: dict[str, float] = {}
    while len(took) < len(procs) and time.monotonic() - started < within:
        for name, proc in procs.items():
            if name not in took and proc.poll() is not None:
                took[name] = time.monotonic() - started
        time.sleep(0.05)
    hung = [name for name in procs if name not in took]
    for name in hung:
        os.killpg(procs[name].pid, signal.SIGKILL)
    assert not hung, f"still waiting after {within:g}s: {hung} (others took {took})"
    return took


def word_lines(prefix: str, count: int) -> list[dict[str, Any]]:
    return [
        {
            "request_id": f"{prefix}-{i}",
            "skill": "local/text-tools",
            "tool": "local/word-count",
            "arguments": {"text": " ".join(["w"] * (i + 1))},
        }
        for i in range(count)
    ]


def test_concurrent_submits_and_batches_on_one_home_each_return_their_own_results_promptly(
    home_folder: Path,
) -> None:
    # Given one empty folder and no broker: 5 `submit --wait` and 2 `batch run` at once
    env = cli_env()
    procs: dict[str, subprocess.Popen[str]] = {}
    for n in range(1, 6):
        text = " ".join(f"w{i}" for i in range(n * 3))
        args = ("local/text-tools", "local/word-count", "--args", json.dumps({"text": text}))
        procs[f"submit-{n}"] = start_cli(
            "submit", *args, "--wait", "--json", cwd=home_folder, env=env
        )
    for name in ("a", "b"):
        lines = word_lines(name, 20)
        batch = home_folder / f"{name}.jsonl"
        batch.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
        procs[f"batch-{name}"] = start_cli(
            "batch", "run", batch.name, "--out", f"{name}.out.jsonl", cwd=home_folder, env=env
        )

    # Then every one returns, within seconds, with its own results
    finish_all(procs, ALL_RETURN_WITHIN_S)
    for n in range(1, 6):
        proc = procs[f"submit-{n}"]
        out, err = proc.communicate()
        assert proc.returncode == 0, err
        assert json.loads(out)["output_data"] == {"words": n * 3}
    for name in ("a", "b"):
        proc = procs[f"batch-{name}"]
        _, err = proc.communicate()
        assert proc.returncode == 0, err
        results = [
            json.loads(line)
            for line in (home_folder / f"{name}.out.jsonl").read_text().splitlines()
        ]
        assert [r["request_id"] for r in results] == [f"{name}-{i}" for i in range(20)]
        assert [r["output_data"] for r in results] == [{"words": i + 1} for i in range(20)]

    # And nothing is left behind: no worker or server process, no message, no chunk
    wait_until(lambda: not processes_using(home_folder), 10, "the local worker to stop")
    assert messages_left(home_folder / ".cleveragents") == {}
    assert not HomeShare(home_folder / ".cleveragents").record_path.exists()


def test_commands_on_one_home_share_one_local_worker_and_the_last_one_out_stops_it(
    home_folder: Path,
) -> None:
    settings = Settings.from_env({"CLEVERAGENTS_HOME": str(home_folder / "home")})
    first = LocalWorker(settings).start()
    second = LocalWorker(settings).start()
    try:
        # Given two commands on one home: one worker serves both
        assert first.pid is not None
        assert first.pid == second.pid
        pid = first.pid
        first.stop()
        # Then the first one out leaves it running for the other
        os.kill(pid, 0)
        with SkillClient(settings=settings) as client:
            done = client.submit("local/text-tools", "local/word-count", {"text": "a b"})
            assert done.result(timeout=30).output_data == {"words": 2}
    finally:
        second.stop()
    # And the last one out stops it (and the server's keeper then stops the server)
    wait_until(lambda: not processes_using(home_folder), 10, "the worker and server to stop")


def test_a_message_held_by_a_killed_worker_goes_back_to_the_queue_and_is_run(
    home_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLEVERAGENTS_HOME", str(home_folder / "home"))
    monkeypatch.setenv("CLEVERAGENTS_RECOVERY_S", "4")  # the reaper's bound, short
    settings = Settings.from_env()
    with SkillClient(settings=settings) as client:
        redis_client = home_client(settings.home)
        worker = LocalWorker(settings).start()
        assert worker.pid is not None
        pid = worker.pid
        # (long enough that a loaded machine still kills the worker while the tool runs)
        handle = client.submit("local/text-tools", "local/sleep", {"seconds": 3})
        wait_until(lambda: holds_messages(redis_client, pid), 20, "the worker to take it")
        # When the worker dies holding it (acks_late: not acknowledged yet)
        os.killpg(pid, signal.SIGKILL)
        wait_until(lambda: not processes_using(home_folder / "home" / "local-worker"), 10,
                   "the killed worker to go")
        worker.stop()
        # Then the next local worker's reaper gives it back, and it runs
        with LocalWorker(settings):
            assert handle.result(timeout=30).output_data == {"slept": 3}
        redis_client.close()
    assert messages_left(settings.home) == {}


def test_a_local_worker_whose_commands_were_killed_stops_by_itself(home_folder: Path) -> None:
    # Given a command holding the home's local worker, killed outright (no cleanup)
    code = (
        "import time\n"
        "from cleveragents.embedded.runner import LocalWorker\n"
        "from cleveragents.settings import Settings\n"
        "LocalWorker(Settings.from_env()).start()\n"
        "print('joined', flush=True)\n"
        "time.sleep(120)\n"
    )
    env = cli_env(CLEVERAGENTS_HOME=str(home_folder / "home"))
    with subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=home_folder,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as command:
        assert command.stdout is not None
        assert command.stdout.readline().strip() == "joined"
        record = HomeShare(home_folder / "home").read()
        assert record is not None
        assert record.alive()
        os.killpg(command.pid, signal.SIGKILL)
    # Then the worker notices it has no user left and stops
    wait_until(lambda: not processes_using(home_folder), 15, "the orphaned worker to stop")
    assert HomeShare(home_folder / "home").read() is None


def test_only_the_last_user_to_leave_gets_the_users_lock(tmp_path: Path) -> None:
    share = HomeShare(tmp_path)
    with share.open_users() as a, share.open_users() as b:
        join(a)
        join(b)
        assert not leave_last(a)
        assert leave_last(b)
        # A newcomer waits while the last user stops the worker
        with share.open_users() as c, pytest.raises(BlockingIOError):
            fcntl.flock(c, fcntl.LOCK_SH | fcntl.LOCK_NB)
