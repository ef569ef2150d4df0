"""The embedded home is private to its user, and its worker record is checked before a signal.

Issue 29, attack 8: a planted ``local-worker/worker.json`` naming another
process's PID and start time made ``cleveragents submit --wait`` kill that
process's whole group (and then crash). The home's folders were 0755 and its
queued messages and results 0644: every local user read the arguments and
results. Now the home is 0700 and its files 0600 whatever the umask, a home of
another user (or one others may write) is refused in one line, and a recorded
PID is signalled only once it is shown to be this home's local worker.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cleveragents.client import SkillClient
from cleveragents.embedded.runner import LocalWorker, home_client, stop_worker
from cleveragents.embedded.server import ServerPaths
from cleveragents.embedded.share import HomeShare, WorkerRecord, process_started
from cleveragents.errors import ConfigurationError
from cleveragents.settings import Settings
from tests.support.procs import REPO, process_alive, wait_until

pytestmark = pytest.mark.timeout(150)

NEEDS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder away needs root")
NOBODY_UID = 65534
WORD_COUNT = ("local/text-tools", "local/word-count", "--args", '{"text": "a b"}')


def cli_env(home: Path) -> dict[str, str]:
    """No broker configured (the embedded default) on ``home``, none of the caller's settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLEVERAGENTS_")}
    env["PYTHONPATH"] = str(REPO)
    env["CLEVERAGENTS_HOME"] = str(home)
    return env


def run_cli(*args: str, home: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cleveragents", *args],
        cwd=cwd,
        env=cli_env(home),
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=120,
        check=False,
    )


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@contextlib.contextmanager
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """A process of the test's own, leading its own group, ended by PID afterwards."""
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def plant_record(home: Path, pid: int) -> None:
    """Write ``worker.json`` naming ``pid`` with its real start time, as share.py records."""
    started = process_started(pid)
    assert started is not None
    folder = home / "local-worker"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    (folder / "worker.json").write_text(json.dumps({"pid": pid, "started": started}))


@pytest.fixture
def work(tmp_path: Path) -> Path:
    folder = tmp_path / "work"
    folder.mkdir()
    return folder


def test_a_planted_worker_record_is_never_signalled_and_submit_runs_its_own_worker(
    work: Path,
) -> None:
    # Given a home whose worker record names a live process that is not its worker
    home = work / "home"
    home.mkdir(mode=0o700)
    with bystander() as sleeper:
        plant_record(home, sleeper.pid)

        # When `submit --wait` runs on that home
        done = run_cli("submit", *WORD_COUNT, "--wait", "--json", home=home, cwd=work)

        # Then it ran on a worker of its own, said the record was not its worker's,
        # and the process the record named was never signalled
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["output_data"] == {"words": 2}
        assert f"PID {sleeper.pid}" in done.stderr
        assert "not this home's local worker" in done.stderr
        assert "Traceback" not in done.stderr
        assert process_alive(sleeper.pid)
        assert sleeper.poll() is None


def test_stopping_leaves_a_process_the_record_names_alone_unless_it_is_the_homes_worker(
    tmp_path: Path,
) -> None:
    # Given a record planted after the worker started (the last command out reads it)
    home = tmp_path / "home"
    share = HomeShare(home)
    with bystander() as sleeper:
        plant_record(home, sleeper.pid)
        record = share.read()
        assert record is not None
        assert record.alive()
        assert not share.is_local_worker(record)

        # When the last command out stops "the worker"
        stop_worker(share, home_client(home))  # (a client never used: not the worker)

        # Then nothing was signalled, and the record is gone
        assert process_alive(sleeper.pid)
        assert share.read() is None


def test_a_local_worker_is_recognised_as_its_own_homes_worker_only(tmp_path: Path) -> None:
    settings = Settings.from_env({"CLEVERAGENTS_HOME": str(tmp_path / "home")})
    with LocalWorker(settings) as local:
        record = HomeShare(settings.home).read()
        assert record is not None
        assert record.pid == local.pid
        assert HomeShare(settings.home).is_local_worker(record)
        # The same process is not the local worker of another home
        assert not HomeShare(tmp_path / "other").is_local_worker(record)
        # Nor is a record naming it with another start time (a reused PID)
        assert not HomeShare(settings.home).is_local_worker(WorkerRecord(record.pid, "1"))


def _every_entry(folder: Path) -> list[Path]:
    return [folder, *folder.rglob("*")]


def test_the_home_its_folders_and_files_are_private_whatever_the_umask(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    settings = Settings.from_env({"CLEVERAGENTS_HOME": str(home)})
    server = ServerPaths.of(home)
    share = HomeShare(home)
    old = os.umask(0)  # the most permissive umask: every mode below is set, not inherited
    try:
        with SkillClient(settings=settings) as client:
            # A message waits in the home's server until a worker runs
            handle = client.submit("local/text-tools", "local/word-count", {"text": "a b"})
            assert stat.S_ISSOCK(server.socket.stat().st_mode)
            assert mode(server.socket) == 0o700
            with LocalWorker(settings) as local:
                assert handle.result(timeout=60).output_data == {"words": 2}
                assert local.pid is not None
                for path in (share.record_path, share.users_path, share.start_path):
                    assert mode(path) == 0o600, path
                assert mode(local.log_path) == 0o600
                assert mode(local.log_path.parent) == 0o700
                assert mode(share.folder) == 0o700
    finally:
        os.umask(old)
    # The server's folder, its append-only files and its log: this user's alone
    entries = [*_every_entry(server.folder), server.log]
    assert any(p.name.endswith(".aof") for p in entries), entries
    for path in entries:
        if path.is_dir():
            assert mode(path) == 0o700, path
        elif not path.is_socket():
            assert mode(path) == 0o600, path
    assert mode(home) == 0o700


def test_submit_creates_a_private_home(work: Path) -> None:
    home = work / "home"
    done = run_cli("submit", *WORD_COUNT, "--wait", home=home, cwd=work)
    assert done.returncode == 0, done.stderr
    assert mode(home) == 0o700
    files = [p for p in _every_entry(ServerPaths.of(home).data) if p.is_file()]
    assert files
    assert all(mode(p) == 0o600 for p in files), files


@NEEDS_ROOT
def test_a_home_owned_by_another_user_is_refused_in_one_line(work: Path) -> None:
    # Given a home that belongs to another user
    home = work / "theirs"
    home.mkdir(mode=0o700)
    os.chown(home, NOBODY_UID, NOBODY_UID)

    # When a command uses it
    done = run_cli("submit", *WORD_COUNT, home=home, cwd=work)

    # Then it is refused in one line naming the fix, and nothing was written there
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0] == (
        f"error: CLEVERAGENTS_HOME {home.resolve()} is owned by uid {NOBODY_UID}, not you "
        f"(uid {os.geteuid()}): use a home of your own, or chown it"
    )
    assert list(home.iterdir()) == []


@pytest.mark.parametrize("loose", [0o777, 0o770, 0o702])
def test_a_home_others_may_write_to_is_refused_in_one_line(work: Path, loose: int) -> None:
    # Given a home of this user that others may write to (they may have planted files)
    home = work / "shared"
    home.mkdir()
    home.chmod(loose)

    # When a command uses it
    done = run_cli("submit", *WORD_COUNT, home=home, cwd=work)

    # Then it is refused, naming the chmod that fixes it, and left as it was
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    who = "others" if loose & 0o002 else "its group"
    shown = home.resolve()
    assert lines[0] == f"error: CLEVERAGENTS_HOME {shown} is writable by {who}: chmod 700 {shown}"
    assert mode(home) == loose
    assert list(home.iterdir()) == []


def test_an_old_home_is_made_private_used_and_its_old_data_named_once(work: Path) -> None:
    # Given a home of the file-based embedded default: 0755 folders, a queued message
    home = work / "home"
    queue = home / "broker" / "queue"
    queue.mkdir(parents=True)
    (queue / "old.msg").write_text("{}")
    for folder in (home, home / "broker", queue):
        folder.chmod(0o755)

    # When a command uses it
    done = run_cli("submit", *WORD_COUNT, "--wait", home=home, cwd=work)

    # Then it runs, the home is closed to others from now on, and one line says where the
    # old data is and that it is not carried over; the old files are left as they were
    assert done.returncode == 0, done.stderr
    assert mode(home) == 0o700
    notes = [line for line in done.stderr.splitlines() if "not carried over" in line]
    assert len(notes) == 1, done.stderr
    assert str(home.resolve() / "broker") in notes[0]
    assert (queue / "old.msg").read_text() == "{}"
    # And the next command does not say it again
    again = run_cli("submit", *WORD_COUNT, "--wait", home=home, cwd=work)
    assert again.returncode == 0, again.stderr
    assert "not carried over" not in again.stderr


@NEEDS_ROOT
def test_a_folder_in_the_home_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    server = home / "server"
    server.mkdir(parents=True, mode=0o700)
    home.chmod(0o700)
    os.chown(server, NOBODY_UID, NOBODY_UID)
    settings = Settings.from_env({"CLEVERAGENTS_HOME": str(home)})
    owned = re.escape(f"{server} in CLEVERAGENTS_HOME is owned by uid {NOBODY_UID}")
    with pytest.raises(ConfigurationError, match=owned):
        SkillClient(settings=settings)


def test_a_home_that_is_a_file_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.write_text("")
    settings = Settings.from_env({"CLEVERAGENTS_HOME": str(home)})
    with pytest.raises(ConfigurationError, match="is not a folder"):
        SkillClient(settings=settings)


def test_a_record_of_a_dead_process_is_replaced_by_the_new_worker(tmp_path: Path) -> None:
    # Given the record of a worker that died long ago (a PID no process holds now)
    home = tmp_path / "home"
    settings = Settings.from_env({"CLEVERAGENTS_HOME": str(home)})
    proc = subprocess.Popen(["true"])
    proc.wait(timeout=10)
    HomeShare(home).folder.mkdir(parents=True, mode=0o700)
    home.chmod(0o700)
    HomeShare(home).write(WorkerRecord(proc.pid, "12345"))
    with LocalWorker(settings) as local:
        assert local.pid != proc.pid
        record = HomeShare(home).read()
        assert record is not None
        assert record.pid == local.pid
    wait_until(lambda: HomeShare(home).read() is None, 5, "the record to go")
