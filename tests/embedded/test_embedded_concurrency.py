"""Commands and workers sharing one embedded home: real CLI processes, real local workers.

Issue 17: three ``submit --wait`` started together in one folder each started a
local worker; each stopped (killed) its own worker as soon as its own result was
in, losing whatever message of another command that worker had taken, and that
command waited for ever. Now the commands on a home share one local worker, the
last one out stops it, and a message a killed worker held goes back to the queue.
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
from kombu import Connection

from cleveragents.client import SkillClient
from cleveragents.embedded.inflight import held_by, inflight_folder, restore_orphans
from cleveragents.embedded.runner import LocalWorker
from cleveragents.embedded.share import HomeShare, join, leave_last
from cleveragents.settings import Settings
from tests.support.procs import REPO, wait_until

pytestmark = pytest.mark.timeout(150)

#: Every command of the concurrency test must have returned within this many seconds.
ALL_RETURN_WITHIN_S = 60.0
TRANSPORT = "cleveragents.broker.embedded.transport:Transport"


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


def messages_left(queue: Path) -> list[str]:
    """Message files (waiting, being written, or held in flight) under the broker folder."""
    waiting = [p.name for p in queue.iterdir()] if queue.exists() else []
    inflight = inflight_folder(queue)
    held = [str(p) for p in inflight.rglob("*.msg")] if inflight.exists() else []
    return waiting + held


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

    # And nothing is left behind: no worker process, no message, no chunk remainder
    wait_until(lambda: not processes_using(home_folder), 5, "the local worker to stop")
    assert messages_left(home_folder / ".cleveragents" / "broker" / "queue") == []
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
    # And the last one out stops it
    assert not processes_using(home_folder)


def test_a_message_held_by_a_killed_worker_goes_back_to_the_queue_and_is_run(
    home_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLEVERAGENTS_HOME", str(home_folder / "home"))
    settings = Settings.from_env()
    queue = home_folder / "home" / "broker" / "queue"
    with SkillClient(settings=settings) as client:
        worker = LocalWorker(settings).start()
        assert worker.pid is not None
        pid = worker.pid
        # (long enough that a loaded machine still kills the worker while the tool runs)
        handle = client.submit("local/text-tools", "local/sleep", {"seconds": 3})
        wait_until(lambda: held_by(queue, pid) == 1, 20, "the worker to take the message")
        # When the worker dies holding it (acks_late: not acknowledged yet)
        os.killpg(pid, signal.SIGKILL)
        wait_until(lambda: not processes_using(home_folder), 10, "the killed worker to go")
        # (a dying process gives up its memory, and so its /proc environ, before its files:
        # its in-flight lock is released a moment after it stops showing up above)
        wait_until(lambda: held_by(queue, pid) == 0, 10, "the killed worker's lock to go")
        worker.stop()  # the last user out puts back what a dead worker held
        assert len(list(queue.glob("*.msg"))) == 1, messages_left(queue)
        # Then the next local worker runs it
        with LocalWorker(settings):
            assert handle.result(timeout=30).output_data == {"slept": 3}
    assert messages_left(queue) == []


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


def _connection(queue: Path) -> Connection:
    # kombu keeps declared exchanges per process, not per folder: a name per test.
    folders = {"data_folder_in": str(queue), "data_folder_out": str(queue)}
    control = {"control_folder": str(queue.parent / "control"), "polling_interval": 0.01}
    return Connection(transport=TRANSPORT, transport_options={**folders, **control})


def test_a_fetched_message_stays_on_disk_until_acknowledged(tmp_path: Path) -> None:
    queue = tmp_path / "broker" / "queue"
    queue.mkdir(parents=True)
    with _connection(queue) as conn, conn.SimpleQueue("held") as box:
        box.put({"n": 1})
        message = box.get(timeout=5)
        # Held: out of the queue, in this consumer's in-flight folder
        assert list(queue.glob("*.msg")) == []
        assert held_by(queue, os.getpid()) == 1
        message.ack()
        assert held_by(queue, os.getpid()) == 0
        box.put({"n": 2})
        box.get(timeout=5)  # not acknowledged: closing gives it back
    assert len(list(queue.glob("*.msg"))) == 1
    assert not list(inflight_folder(queue).rglob("*.msg"))


def test_a_dead_consumers_message_goes_back_to_its_place_and_a_live_ones_stays(
    tmp_path: Path,
) -> None:
    queue = tmp_path / "broker" / "queue"
    queue.mkdir(parents=True)
    with _connection(queue) as conn, conn.SimpleQueue("orphans") as box:
        box.put({"n": 1})
        # Not a wait for an event: queue order is by the millisecond a message was sent
        time.sleep(0.01)
        box.put({"n": 2})
    # Given a consumer process that takes the first message and dies without acknowledging it
    code = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from tests.embedded.test_embedded_concurrency import _connection\n"
        "conn = _connection(Path(sys.argv[1]))\n"
        "assert conn.SimpleQueue('orphans').get(timeout=5).payload == {'n': 1}\n"
        "os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", code, str(queue)], cwd=REPO, check=True, timeout=60)
    assert len(list(queue.glob("*.msg"))) == 1
    assert len(list(inflight_folder(queue).rglob("*.msg"))) == 1
    # When a live consumer fetches
    with _connection(queue) as conn, conn.SimpleQueue("orphans") as box:
        message = box.get(timeout=5)
        # Then the dead one's message came back first, in its place in the queue
        assert message.payload == {"n": 1}
        assert held_by(queue, os.getpid()) == 1
        # And a sweep leaves a live consumer's message alone
        assert restore_orphans(queue) == 0
        assert held_by(queue, os.getpid()) == 1
        assert len(list(queue.glob("*.msg"))) == 1
