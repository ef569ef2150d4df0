"""Confined command tools and bounded output, through the runtime in this process (issue 12).

Descendants that leave their session are found and killed; output is read with a
deadline and up to a limit; failure excerpts are short and redacted; a tool user
gets a folder of its own and nothing of the worker's; a non-dumpable process keeps
its environment from its own user. The same behaviours through a real worker are
in tests/faults/test_hostile_tools.py.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cleveragents.errors import ConfigurationError, ToolExecutionError
from cleveragents.runtime import invoke
from cleveragents.runtime.confined import (
    STOP_WAIT_S,
    ToolUser,
    can_run_python,
    tool_user_for,
)
from cleveragents.runtime.kinds.command import run_command_tool
from cleveragents.skills import SkillErrorType, SkillResult, ToolSpec
from tests.fixtures.catalogues import FIXTURES, cmd_tool, request, single
from tests.support.procs import REPO, process_alive, wait_until

pytestmark = pytest.mark.timeout(120)

SECRET = "hunter2-argument-secret-9c1d"
NOBODY = ToolUser("nobody", 65534, 65534)
#: What a loaded machine may add to a bound.
SLACK_S = 1.5


def _misbehave(timeout_s: float = 5.0) -> ToolSpec:
    return cmd_tool("test/misbehave", "cmd_misbehave", timeout_s=timeout_s)


def _python_flood() -> ToolSpec:
    return ToolSpec(
        name="test/misbehave",
        source="python",
        entrypoint="tests.fixtures.hostile_tool_fns:python_flood",
    )


def _failed(result: SkillResult, reason: str | None = None) -> dict[str, Any]:
    assert not result.success, result
    assert result.error is not None
    assert result.error.error_type == SkillErrorType.TOOL_EXECUTION_FAILURE, result.error
    if reason is not None:
        assert result.error.details.get("reason") == reason, result.error
    return result.error.details


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder every user may write."""
    folder = Path(tempfile.mkdtemp(prefix="confinement-"))
    folder.chmod(0o1777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


# --- descendants ------------------------------------------------------------------------------


def test_a_tool_that_exits_leaving_an_escaped_grandchild_succeeds_at_once(
    shared_dir: Path,
) -> None:
    # Given a tool whose child left its session holding stdout; the tool prints and exits
    pid_file = shared_dir / "child.pid"
    cat = single(cmd_tool("test/escape", "cmd_escape", timeout_s=5))

    started = time.monotonic()
    result = invoke(request("test/escape", arguments={"pid_file": str(pid_file)}), cat)

    # Then the result is its value, decided when it exited, and the grandchild is dead
    assert result.success, result.error
    assert time.monotonic() - started < 5.0
    assert not process_alive(int(pid_file.read_text()))


def test_a_hanging_tool_with_an_escaped_grandchild_is_all_gone_within_its_timeout_plus_2s(
    shared_dir: Path,
) -> None:
    pid_file = shared_dir / "child.pid"
    cat = single(cmd_tool("test/escape", "cmd_escape", timeout_s=1))

    started = time.monotonic()
    result = invoke(
        request("test/escape", arguments={"pid_file": str(pid_file), "hang": True}), cat
    )

    _failed(result, "timeout")
    assert time.monotonic() - started < 1.0 + 2.0
    assert not process_alive(int(pid_file.read_text()))


def test_a_tree_that_keeps_forking_away_from_its_parents_is_killed_whole(shared_dir: Path) -> None:
    # Given a chain of processes, each forking a child into a new session and exiting
    pid_file = shared_dir / "pids"
    cat = single(_misbehave(timeout_s=1.0))

    result = invoke(
        request("test/misbehave", arguments={"do": "forker", "pid_file": str(pid_file)}), cat
    )

    # Then after the time-out none of them is alive, and none appears later: the lock the
    # whole chain shares is free, so no process of it is left to fork or write
    _failed(result, "timeout")
    pids = [int(p) for p in pid_file.read_text().split()]
    assert len(pids) > 3
    wait_until(lambda: _unlocked(Path(f"{pid_file}.lock")), 5, "the chain's last process gone")
    assert [p for p in pids if process_alive(p)] == []
    assert len(pid_file.read_text().split()) == len(pids)


def _unlocked(path: Path) -> bool:
    """True when nobody holds a lock on ``path`` (taken and let go again at once)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def test_the_tools_tree_dies_with_the_process_that_ran_it(shared_dir: Path) -> None:
    # Given a process running a command tool that hangs with an escaped grandchild
    pid_file = shared_dir / "child.pid"
    script = (
        "from cleveragents.runtime import invoke\n"
        "from tests.fixtures.catalogues import cmd_tool, request, single\n"
        "cat = single(cmd_tool('test/escape', 'cmd_escape', timeout_s=60))\n"
        f"invoke(request('test/escape', arguments={{'pid_file': {str(pid_file)!r}, "
        "'hang': True}), cat)\n"
    )
    runner = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, start_new_session=True)
    try:
        wait_until(lambda: _written(pid_file), 30, "the grandchild to start")
        grandchild = int(pid_file.read_text())
        # When that process is killed outright (as the hard time limit ends a pool process)
        runner.kill()
        runner.wait(10)
        # Then the tool and its grandchild die too (the shepherd's parent-death signal)
        wait_until(
            lambda: not process_alive(grandchild), STOP_WAIT_S + SLACK_S, "the grandchild to die"
        )
    finally:
        runner.kill()


def test_a_tool_that_kills_its_shepherd_is_a_failure_at_once() -> None:
    # Given a tool (same user as the shepherd) that kills its shepherd, then sleeps
    cat = single(_misbehave(timeout_s=10.0))

    started = time.monotonic()
    result = invoke(request("test/misbehave", arguments={"do": "kill-shepherd"}), cat)

    # Then it is a failure long before its timeout, and nothing waits for its pipes
    details = _failed(result)
    assert "killed from outside" in result.error.message  # type: ignore[union-attr]
    assert "stderr_tail" in details
    assert time.monotonic() - started < 5.0


def test_a_tool_that_never_reads_a_large_input_does_not_block_its_runner() -> None:
    tool = ToolSpec(
        name="test/deaf",
        source="command",
        command=["python3", str(FIXTURES / "cmd_misbehave.py"), "ignore-stdin"],
        timeout_s=5,
    )

    started = time.monotonic()
    result = invoke(request("test/deaf", arguments={"blob": "x" * 900_000}), single(tool))

    assert result.success, result.error
    assert time.monotonic() - started < 5.0


# --- bounded output ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["command", "python"])
def test_output_over_the_limit_is_refused_and_under_it_kept(kind: str) -> None:
    limit = 10_000
    tool = _misbehave() if kind == "command" else _python_flood()

    def run(size: int) -> SkillResult:
        arguments = {"do": "print", "size": size} if kind == "command" else {"size": size}
        return invoke(request("test/misbehave", arguments=arguments), single(tool),
                      max_output_bytes=limit)

    fits, too_big = run(limit - 2), run(limit)  # a JSON string: two quotes more

    assert fits.success, fits.error
    assert len(fits.output_data) == limit - 2
    details = _failed(too_big, "output_too_large")
    assert details["limit_bytes"] == limit
    assert too_big.output_data is None


def test_resource_changes_count_towards_the_output_limit() -> None:
    cat = single(_misbehave())

    result = invoke(
        request("test/misbehave", arguments={"do": "print", "size": 10, "changes": 500}),
        cat,
        max_output_bytes=5_000,
    )

    _failed(result, "output_too_large")
    assert result.resource_changes == []


def test_the_default_output_limit_is_ten_megabytes() -> None:
    cat = single(_python_flood())

    result = invoke(request("test/misbehave", arguments={"size": 10_000_001}), cat)

    assert _failed(result, "output_too_large")["limit_bytes"] == 10_000_000


# --- short, redacted excerpts -----------------------------------------------------------------


@pytest.mark.parametrize("do", ["echo-fail", "garbage-echo"])
def test_failure_excerpts_are_short_and_never_quote_an_argument(do: str) -> None:
    cat = single(_misbehave())

    result = invoke(
        request("test/misbehave", arguments={"do": do, "token": SECRET, "n": ["x", SECRET]}), cat
    )

    details = _failed(result)
    stored = result.model_dump_json()
    assert SECRET not in stored
    assert "[redacted]" in details["stderr_tail"]
    assert len(details["stderr_tail"]) <= 1_000
    if do == "garbage-echo":
        assert "not JSON" in details["stdout_head"]
        assert len(details["stdout_head"]) <= 100


# --- the tool user ----------------------------------------------------------------------------


def test_in_process_command_tools_run_as_the_calling_user() -> None:
    result = invoke(request("test/misbehave", arguments={"do": "whoami"}), single(_misbehave()))

    assert result.success, result.error
    assert result.output_data["uid"] == os.geteuid()


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_a_tool_user_gets_a_folder_of_its_own_for_home_and_resource_changes() -> None:
    # Given root running a command tool as nobody
    output = run_command_tool(
        _misbehave(), {"do": "whoami"}, 5.0, user=NOBODY, own_python=can_run_python(NOBODY)
    )

    # Then it ran as nobody, with a private home and TMPDIR it could write its changes to
    assert output.data["uid"] == NOBODY.uid
    assert output.data["home"] == output.data["tmp"]
    assert output.data["home"].startswith(tempfile.gettempdir())
    assert output.resource_changes == [{"action": "created", "resource": "file:///whoami"}]
    assert not Path(output.data["home"]).exists()  # removed afterwards


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
@pytest.mark.parametrize("do", ["changes-link", "changes-fifo"])
def test_a_resource_changes_file_that_is_not_a_plain_file_of_the_tool_is_refused(do: str) -> None:
    # Given a tool (as nobody) that makes its changes file a link to a root-only file, or a FIFO
    started = time.monotonic()

    # When the runtime (as root) reads the changes
    with pytest.raises(ToolExecutionError, match="not a plain file"):
        run_command_tool(_misbehave(), {"do": do, "target": "/etc/shadow"}, 5.0, user=NOBODY,
                         own_python=can_run_python(NOBODY))

    # Then it is refused, promptly, and nothing of the target is read
    assert time.monotonic() - started < 5.0


def test_tool_user_for_switches_a_root_worker_to_nobody_by_default() -> None:
    assert tool_user_for(None, euid=0) == ToolUser("nobody", 65534, 65534)
    assert tool_user_for(None, euid=1000) is None
    assert tool_user_for("root", euid=0) is None  # the worker's own user: no switch
    assert tool_user_for("65534", euid=0) == ToolUser("nobody", 65534, 65534)


def test_tool_user_for_refuses_what_cannot_work() -> None:
    with pytest.raises(ConfigurationError, match="no user"):
        tool_user_for("no-such-user-xyz", euid=0)
    with pytest.raises(ConfigurationError, match="only a worker running as root"):
        tool_user_for("nobody", euid=1000)


# --- a non-dumpable process -------------------------------------------------------------------


def _python_for(user: ToolUser) -> str:
    """An interpreter ``user`` can run: ours if it can, else the system's."""
    if can_run_python(user):
        return sys.executable
    system = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
    assert system is not None, "no python3 that an ordinary user can run"
    return system


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start processes as nobody")
@pytest.mark.parametrize("closed", [True, False], ids=["non-dumpable", "control"])
def test_a_non_dumpable_process_keeps_its_environment_from_its_own_user(closed: bool) -> None:
    # Given a process of an ordinary user holding a secret in its environment (the compose
    # file's worker), made non-dumpable by cleveragents/worker/process_privacy.py, or not (the
    # control)
    program = (
        "import importlib.util, sys, time\n"
        f"spec = importlib.util.spec_from_file_location('closed', {str(REPO / 'cleveragents' / 'worker' / 'process_privacy.py')!r})\n"  # noqa: E501
        "closed = importlib.util.module_from_spec(spec); spec.loader.exec_module(closed)\n"
        "if sys.argv[1] == 'closed': closed.make_undumpable()\n"
        "print('ready', flush=True); time.sleep(60)\n"
    )
    python = _python_for(NOBODY)
    worker = subprocess.Popen(
        [python, "-c", program, "closed" if closed else "open"],
        env={"PLANTED_SECRET": SECRET}, user=NOBODY.uid, group=NOBODY.gid, extra_groups=[],
        stdout=subprocess.PIPE, cwd="/",
    )
    assert worker.stdout is not None
    try:
        assert worker.stdout.readline() == b"ready\n"
        # When another process of the same user (a command tool) reads its environment
        snoop = subprocess.run(
            [python, "-c", f"import sys; sys.stdout.buffer.write(open('/proc/{worker.pid}/environ', 'rb').read())"],  # noqa: E501
            user=NOBODY.uid, group=NOBODY.gid, extra_groups=[], capture_output=True, cwd="/",
            check=False,
        )
    finally:
        worker.kill()
        worker.wait()
        worker.stdout.close()

    # Then only the dumpable one gives its secret away
    if closed:
        assert snoop.returncode != 0
        assert b"Permission denied" in snoop.stderr
        assert SECRET.encode() not in snoop.stdout
    else:
        assert SECRET.encode() in snoop.stdout, snoop.stderr


def test_make_undumpable_reports_what_it_did() -> None:
    # In a child process, so that this test process stays as it was
    code = (
        "import importlib.util, json\n"
        f"spec = importlib.util.spec_from_file_location('closed', {str(REPO / 'cleveragents' / 'worker' / 'process_privacy.py')!r})\n"  # noqa: E501
        "closed = importlib.util.module_from_spec(spec); spec.loader.exec_module(closed)\n"
        "before = closed.is_dumpable(); note = closed.make_undumpable()\n"
        "print(json.dumps([before, closed.is_dumpable(), note[1]]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True)

    before, after, note = json.loads(done.stdout)
    assert (before, after) == (True, False)
    assert "non-dumpable" in note


def _written(path: Path) -> bool:
    """Whether ``path`` holds its line yet (a file is created before it is written)."""
    return path.exists() and bool(path.read_text(encoding="utf-8").strip())


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_a_tool_refused_by_file_permissions_says_who_it_ran_as_and_the_fix(tmp_path: Path) -> None:
    from cleveragents.cli.failure_text import fix_for
    from cleveragents.skills import SkillError

    # Given a root-owned file only root may write, and a command tool run as nobody
    target = tmp_path / "log.txt"
    target.write_text("")
    target.chmod(0o600)
    tool = ToolSpec(
        name="test/append-log", source="command", command=["sh", "-c", f"echo x >> {target}"]
    )
    # When it fails to write there
    with pytest.raises(ToolExecutionError) as failed:
        run_command_tool(tool, {}, 5.0, user=NOBODY, own_python=False)
    # Then its message says who ran it, and its fix how to change that
    assert "Permission denied" in failed.value.details["stderr_tail"]
    assert str(failed.value).endswith(
        "(it ran as user 'nobody', who may not read or write what the worker's user can)"
    )
    assert failed.value.details["tool_user"] == "nobody"
    error = SkillError(
        skill_name="test/confined",
        error_type=SkillErrorType.TOOL_EXECUTION_FAILURE,
        message=str(failed.value),
        details=failed.value.details,
    )
    fix = fix_for(error)
    assert fix is not None
    assert "ran as 'nobody'" in fix
    assert "CLEVERAGENTS_TOOL_USER" in fix
    # And a failure that is not about permissions says nothing of the user
    with pytest.raises(ToolExecutionError) as other:
        run_command_tool(
            ToolSpec(name="test/exit-3", source="command", command=["sh", "-c", "exit 3"]),
            {}, 5.0, user=NOBODY, own_python=False,
        )
    assert "tool_user" not in other.value.details
