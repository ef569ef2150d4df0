"""The ``command`` tool kind: argv from the catalogue, JSON on stdin, one JSON value on stdout.

No shell is involved: the arguments travel on stdin only, so nothing in them can
reach a command line. The tool runs in its own process group, which is killed
whole on time-out. It gets a minimal environment (no worker secrets) plus the
variables its spec passes through by name. This module turns what can go
wrong into the library's errors: a program that cannot start
(``ToolActivationError``), a time-out (``ToolTimedOut``), a non-zero exit or
stdout that is not JSON (``ToolExecutionError``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from cleveragents.constants import STDERR_TAIL_CHARS
from cleveragents.errors import ToolActivationError, ToolExecutionError, ToolTimedOut
from cleveragents.runtime.output import ToolOutput
from cleveragents.skills import ToolSpec

__all__ = ["BASE_ENV", "KIND", "CommandKind", "run_command_tool"]

#: Variables every command tool gets from the worker: enough to find programs and run Python.
BASE_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV")


def _environment(tool: ToolSpec, changes_file: str) -> dict[str, str]:
    env = {k: os.environ[k] for k in (*BASE_ENV, *tool.pass_env) if k in os.environ}
    env["CLEVERAGENTS_RESOURCE_CHANGES"] = changes_file
    # "python3" in a command means the worker's own interpreter (its venv), found first.
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", os.defpath)])
    env.setdefault("PYTHONPATH", os.getcwd())
    return env


def _tail(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")[-STDERR_TAIL_CHARS:]


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _read_changes(path: Path) -> list[dict[str, Any]]:
    changes: list[dict[str, Any]] = []
    if not path.exists():
        return changes
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            change = json.loads(line)
        except ValueError:
            raise ToolExecutionError(
                f"resource change line {number} is not JSON",
                details={"line": number},
            ) from None
        changes.append(change)
    return changes


def _start(tool: ToolSpec, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    try:
        return subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,  # its own process group: killed whole on time-out
            close_fds=True,
        )
    except OSError as exc:
        raise ToolActivationError(
            f"tool activation failed for {tool.name!r}: cannot start {argv[0]!r}: {exc}",
            details={"command": argv},
        ) from None


def _communicate(
    tool: ToolSpec, proc: subprocess.Popen[bytes], payload: bytes, timeout_s: float
) -> tuple[bytes, bytes]:
    """Feed stdin, collect stdout and stderr; kill the process group at the timeout."""
    try:
        return proc.communicate(payload, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        _, stderr = proc.communicate()
        raise ToolTimedOut(
            tool.name,
            timeout_s,
            details={"exit_code": proc.returncode, "stderr_tail": _tail(stderr)},
        ) from None
    except BaseException:
        _kill_group(proc)
        proc.wait()
        raise
    finally:
        _kill_group(proc)  # children it left behind go with it


def _parse_stdout(tool: ToolSpec, returncode: int, stdout: bytes, stderr: bytes) -> Any:
    """The one JSON value the tool printed, once it exited 0."""
    if returncode != 0:
        raise ToolExecutionError(
            f"tool {tool.name!r} exited with code {returncode}",
            details={"exit_code": returncode, "stderr_tail": _tail(stderr)},
        )
    try:
        return json.loads(stdout)
    except ValueError:
        raise ToolExecutionError(
            f"tool {tool.name!r} did not print one JSON value on stdout",
            details={
                "exit_code": returncode,
                "stderr_tail": _tail(stderr),
                "stdout_head": stdout[:200].decode("utf-8", errors="replace"),
            },
        ) from None


def run_command_tool(tool: ToolSpec, arguments: dict[str, Any], timeout_s: float) -> ToolOutput:
    """Run the tool's command with the arguments as JSON on stdin.

    Raises:
        ToolActivationError: the program cannot be started.
        ToolTimedOut: it outlived ``timeout_s``; its process group was killed.
        ToolExecutionError: non-zero exit, or stdout that is not one JSON value;
            details carry ``exit_code`` and ``stderr_tail``.
    """
    argv = list(tool.command or [])
    payload = json.dumps(arguments).encode()
    with tempfile.TemporaryDirectory(prefix="cleveragents-") as scratch:
        changes_path = Path(scratch) / "resource-changes.jsonl"
        proc = _start(tool, argv, _environment(tool, str(changes_path)))
        stdout, stderr = _communicate(tool, proc, payload, timeout_s)
        data = _parse_stdout(tool, proc.returncode, stdout, stderr)
        return ToolOutput(data, _read_changes(changes_path))


class CommandKind:
    """Tools that are programs, run without a shell (``source: command``)."""

    def check(self, tool: ToolSpec) -> None:
        """A command tool needs ``command``, a non-empty argv, and no ``entrypoint``."""
        if not tool.command or not all(isinstance(a, str) and a for a in tool.command):
            raise ValueError(
                f"command tool {tool.name!r} needs command: a non-empty list of strings"
            )
        if tool.entrypoint is not None:
            raise ValueError(f"command tool {tool.name!r} must not set entrypoint")

    #: Run the command; see ``run_command_tool``.
    run = staticmethod(run_command_tool)


#: The registered ``command`` kind.
KIND = CommandKind()
