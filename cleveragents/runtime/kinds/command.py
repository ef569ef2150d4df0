"""The ``command`` tool kind: argv from the catalogue, JSON on stdin, one JSON value on stdout.

No shell is involved: the arguments travel on stdin only, so nothing in them can
reach a command line. The program runs confined (``confined.py``): under a
shepherd that kills every process it started, in its own session, as the tool
user when one is set (``CommandKind.run_as``), with a minimal environment (no
worker secrets) plus the variables its spec passes through by name; its stdout
is read up to the output limit and no further. This module turns what can go
wrong into the library's errors: a program that cannot start
(``ToolActivationError``), a time-out (``ToolTimedOut``), too much output
(``ToolOutputTooLarge``), a non-zero exit or stdout that is not JSON
(``ToolExecutionError``). Failure details keep short excerpts of stdout and
stderr, with every string of the arguments blanked out.

A tool read from a skill file runs with its skill folder at hand, so that the
folder can be copied anywhere (``resolve_command``): relative paths of the
command that name something in the folder are made absolute there, the folder
comes first on ``PYTHONPATH`` (``python3 -m module`` finds the folder's modules),
and ``CLEVERAGENTS_SKILL_DIR`` names it. The program still runs in the worker's
current folder, as documented, unless it is sandboxed.

A sandboxed tool (its ``sandbox``, or ``CLEVERAGENTS_SANDBOX=1``: ``CommandKind.sandbox_with``)
runs the same way, but the shepherd starts it under bubblewrap (``runtime/sandbox.py``),
in its scratch folder; a worker that cannot make the sandbox refuses the tool
(``sandbox_unavailable``) rather than run it without one.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cleveragents.constants import REDACTED, STDERR_TAIL_CHARS, STDOUT_HEAD_CHARS
from cleveragents.errors import (
    CleverAgentsError,
    ToolActivationError,
    ToolExecutionError,
    ToolOutputTooLarge,
    ToolTimedOut,
    TransientToolError,
)
from cleveragents.runtime.confined import Finished, ToolUser, can_run_python, run_confined
from cleveragents.runtime.output import ToolOutput
from cleveragents.runtime.output_limit import max_output_bytes
from cleveragents.runtime.sandbox import Sandboxing, sandboxed_environment
from cleveragents.runtime.text import blank_arguments
from cleveragents.skills import ToolSpec

__all__ = [
    "BASE_ENV",
    "KIND",
    "SKILL_DIR_ENV",
    "CommandKind",
    "forwarder_python",
    "resolve_command",
    "run_command_tool",
]

#: Variables every command tool gets from the worker: enough to find programs and run Python.
BASE_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV")
#: The variable that names a command tool's skill folder (set when it has one).
SKILL_DIR_ENV = "CLEVERAGENTS_SKILL_DIR"
#: The exit code of a transient failure (sysexits.h ``EX_TEMPFAIL``): retried under a
#: ``retry`` policy (``cleveragents.pipeline.retries``).
EX_TEMPFAIL = 75


def _in_folder(word: str, folder: Path, *, program: bool) -> str:
    """``word`` made absolute in ``folder`` when it is a relative path of something there."""
    if not word or word.startswith(("-", "/")) or (program and "/" not in word):
        return word  # an option, an absolute path, or a program that PATH finds
    candidate = folder / word
    try:
        if candidate.is_file() or ("/" in word and candidate.exists()):
            return str(candidate) + ("/" if word.endswith("/") else "")
    except (OSError, ValueError):
        # Not a name a file can have (longer than a file name, a NUL byte): a word of
        # data, such as an inline program or a JSON string, passed as written.
        pass
    return word


def resolve_command(argv: list[str], folder: Path | None) -> list[str]:
    """The argv to run: relative paths that name something in the skill folder, made absolute.

    The program (``argv[0]``) when it is written with a ``/`` (``./reverse.sh``,
    ``bin/tool``) and names something in ``folder``; each argument that does not
    start with ``-`` and names a file of ``folder`` (``scripts/x.py``,
    ``reverse.py``), or, written with a ``/``, a folder of it (``data/``). Every
    other word is left as written: a bare program is looked up on ``PATH``, a
    bare word that is not a file there (``-m module``) stays a word, and a
    relative path the folder does not have resolves against the current folder,
    as before. Without a skill folder (a tool built in code) nothing changes.
    """
    if folder is None:
        return list(argv)
    return [_in_folder(word, folder, program=i == 0) for i, word in enumerate(argv)]


def _environment(
    tool: ToolSpec, scratch: str, user: ToolUser | None, own_python: bool = True
) -> dict[str, str]:
    env = {k: os.environ[k] for k in (*BASE_ENV, *tool.pass_env) if k in os.environ}
    env["CLEVERAGENTS_RESOURCE_CHANGES"] = str(Path(scratch) / "resource-changes.jsonl")
    path = env.get("PATH", os.defpath)
    if own_python:  # "python3" in a command means the worker's own interpreter (its venv)
        path = os.pathsep.join([os.path.dirname(sys.executable), path])
    env["PATH"] = path
    env.setdefault("PYTHONPATH", os.getcwd())
    if tool.skill_folder is not None:  # the skill's own modules first, then as before
        env["PYTHONPATH"] = os.pathsep.join([str(tool.skill_folder), env["PYTHONPATH"]])
        env[SKILL_DIR_ENV] = str(tool.skill_folder)
    if user is not None:  # the worker's home and temporary folder are not the tool user's
        env["HOME"] = env["TMPDIR"] = scratch
    return env


def _excerpt(raw: bytes, arguments: dict[str, Any], *, head: bool) -> str:
    """The first or last characters of ``raw``, every argument string in it blanked out."""
    text = blank_arguments(raw.decode("utf-8", errors="replace"), arguments, REDACTED)
    return text[:STDOUT_HEAD_CHARS] if head else text[-STDERR_TAIL_CHARS:]


def _read_changes(path: Path, user: ToolUser | None, budget: int, tool: str) -> list[Any]:
    """The resource changes the tool appended, read without following a link or a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return []
    except OSError:
        raise ToolExecutionError(
            f"tool {tool!r}: the resource changes file is not a plain file of the tool's"
        ) from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or (user is not None and info.st_uid != user.uid):
            raise ToolExecutionError(
                f"tool {tool!r}: the resource changes file is not a plain file of the tool's"
            )
        raw = handle.read(budget + 1)
    if len(raw) > budget:
        raise ToolOutputTooLarge(tool, "output and resource changes", max_output_bytes())
    changes: list[Any] = []
    for number, line in enumerate(raw.decode("utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            changes.append(json.loads(line))
        except ValueError:
            raise ToolExecutionError(
                f"resource change line {number} is not JSON", details={"line": number}
            ) from None
    return changes


def _check(
    tool: ToolSpec, argv: list[str], finished: Finished, arguments: dict[str, Any], timeout_s: float
) -> Any:
    """The one JSON value the tool printed, once it exited 0; else the error it is."""
    tail = _excerpt(finished.stderr_tail, arguments, head=False)
    if finished.exec_error is not None:
        raise ToolActivationError(
            f"tool activation failed for {tool.name!r}: cannot start {argv[0]!r}: "
            f"{finished.exec_error}",
            details={"command": list(tool.command or [])},
        )
    if finished.too_large:
        raise ToolOutputTooLarge(tool.name, "output", max_output_bytes())
    if finished.timed_out:
        raise ToolTimedOut(tool.name, timeout_s, details={"exit_code": None, "stderr_tail": tail})
    if finished.lost or finished.exit_code is None:
        raise ToolExecutionError(
            f"tool {tool.name!r} was killed from outside before it ended",
            details={"stderr_tail": tail},
        )
    if finished.exit_code == EX_TEMPFAIL:  # sysexits: "try again later"
        raise TransientToolError(
            f"tool {tool.name!r} exited with code {EX_TEMPFAIL} (EX_TEMPFAIL: a transient failure)",
            details={"exit_code": finished.exit_code, "stderr_tail": tail},
        )
    if finished.exit_code != 0:
        raise ToolExecutionError(
            f"tool {tool.name!r} exited with code {finished.exit_code}",
            details={"exit_code": finished.exit_code, "stderr_tail": tail},
        )
    try:
        return json.loads(finished.stdout)
    except ValueError:
        raise ToolExecutionError(
            f"tool {tool.name!r} did not print one JSON value on stdout",
            details={
                "exit_code": 0,
                "stderr_tail": tail,
                "stdout_head": _excerpt(finished.stdout, arguments, head=True),
            },
        ) from None


#: What a refusal by file permissions looks like in an error or a stderr tail.
_DENIED = ("Permission denied", "EACCES", "Errno 13")


def _said_who_ran_it(
    exc: CleverAgentsError, finished: Finished, user: ToolUser | None
) -> CleverAgentsError:
    """``exc``, saying who the tool ran as when file permissions refused it something
    and that user is not the worker's: the worker's own files are not that user's."""
    if user is None:
        return exc
    tail = finished.stderr_tail.decode("utf-8", errors="replace")
    seen = f"{finished.exec_error or ''}\n{tail}"
    if not any(mark in seen for mark in _DENIED):
        return exc
    exc.args = (
        f"{exc} (it ran as user {user.name!r}, who may not read or write what the "
        "worker's user can)",
    )
    exc.details = {**exc.details, "tool_user": user.name}
    return exc


@contextlib.contextmanager
def scratch_folder(user: ToolUser | None) -> Iterator[str]:
    """A private folder for the tool's resource changes (its home and TMPDIR as another user)."""
    with tempfile.TemporaryDirectory(prefix="cleveragents-") as folder:
        if user is not None:
            os.chown(folder, user.uid, user.gid)
        yield folder


def forwarder_python(own_python: bool) -> str:
    """An interpreter the tool user can run: this process's, else ``python3``, looked up
    on ``PATH`` inside the sandbox past any the user may not run (as ``execvp`` does)."""
    return sys.executable if own_python else "python3"


def run_command_tool(
    tool: ToolSpec,
    arguments: dict[str, Any],
    timeout_s: float,
    *,
    user: ToolUser | None = None,
    own_python: bool = True,
    sandboxing: Sandboxing | None = None,
) -> ToolOutput:
    """Run the tool's command with the arguments as JSON on stdin, confined (module docstring).

    ``user``: who it runs as (None: this process's user). ``own_python``: ``python3``
    means this process's interpreter, found first on ``PATH``. ``sandboxing``: how
    sandboxes are made (None: the command kind's).

    Raises:
        ToolActivationError: the program cannot be started, or it is sandboxed and no
            sandbox can be made here (``details["reason"] == "sandbox_unavailable"``).
        ToolTimedOut: it outlived ``timeout_s``; it and every process it started were killed.
        ToolOutputTooLarge: stdout (or stdout and resource changes) past the output limit.
        ToolExecutionError: non-zero exit, or stdout that is not one JSON value;
            details carry ``exit_code`` and ``stderr_tail``.
    """
    argv = resolve_command(list(tool.command or []), tool.skill_folder)
    payload = json.dumps(arguments).encode()
    limit = max_output_bytes()
    sandboxing = KIND.sandboxing if sandboxing is None else sandboxing
    policy = sandboxing.policy(tool)
    bwrap = sandboxing.require(tool.name, user) if policy is not None else None
    with scratch_folder(user) as scratch, contextlib.ExitStack() as stack:
        env = _environment(tool, scratch, user, own_python)
        run_argv = argv
        if bwrap is not None and policy is not None:
            python = forwarder_python(own_python)
            run_argv, added = stack.enter_context(
                sandboxing.wrapped(bwrap, argv, policy, scratch, tool=tool.name, python=python)
            )
            env = sandboxed_environment(env, added)
        finished = _started(tool, argv, run_argv, env, payload, timeout_s, limit, user)
        try:
            data = _check(tool, argv, finished, arguments, timeout_s)
        except (ToolActivationError, ToolExecutionError) as exc:
            raise _said_who_ran_it(exc, finished, user) from None
        budget = limit - len(finished.stdout)
        changes = _read_changes(Path(env["CLEVERAGENTS_RESOURCE_CHANGES"]), user, budget, tool.name)
        return ToolOutput(data, changes)


def _started(
    tool: ToolSpec,
    argv: list[str],
    run_argv: list[str],
    env: dict[str, str],
    payload: bytes,
    timeout_s: float,
    limit: int,
    user: ToolUser | None,
) -> Finished:
    """The program run under its shepherd to its end (``ToolActivationError``: no shepherd)."""
    try:
        return run_confined(run_argv, env, payload, timeout_s, max_stdout=limit, user=user)
    except OSError as exc:
        raise ToolActivationError(
            f"tool activation failed for {tool.name!r}: cannot start its shepherd: {exc}",
            details={"command": argv},
        ) from None


class CommandKind:
    """Tools that are programs, run confined and without a shell (``source: command``)."""

    #: Its tools may ask for a sandbox (``runtime/sandbox.py``).
    sandboxable = True

    def __init__(self) -> None:
        self.user: ToolUser | None = None
        self.own_python = True
        self.sandboxing = Sandboxing()

    def sandbox_with(self, sandboxing: Sandboxing) -> None:
        """Make the sandboxes of this process's command tools and stdio MCP servers so.

        A worker calls it once at start (``CLEVERAGENTS_SANDBOX``, ``CLEVERAGENTS_BWRAP``).
        """
        self.sandboxing = sandboxing

    def run_as(self, user: ToolUser | None) -> str | None:
        """Run every later command tool of this process as ``user`` (None: this process's own).

        A worker calls it once at start (``CLEVERAGENTS_TOOL_USER``, see
        ``confined.tool_user_for``); switching needs root. Returns a warning when
        ``user`` cannot run this process's interpreter: ``python3`` in a command is
        then whatever ``PATH`` finds first that it can run.
        """
        self.user = user
        self.own_python = user is None or can_run_python(user)
        if self.own_python:
            return None
        return (
            f"command tools run as {user.name!r}, who cannot run this worker's interpreter "  # type: ignore[union-attr]
            f"{sys.executable}: 'python3' in a command is the first on PATH it can run "
            "(install the worker's Python where that user can read it, or set "
            "CLEVERAGENTS_TOOL_USER)"
        )

    def check(self, tool: ToolSpec) -> None:
        """A command tool needs ``command``, a non-empty argv, and no ``entrypoint``."""
        if not tool.command or not all(isinstance(a, str) and a for a in tool.command):
            raise ValueError(
                f"command tool {tool.name!r} needs command: a non-empty list of strings"
            )
        if tool.entrypoint is not None:
            raise ValueError(f"command tool {tool.name!r} must not set entrypoint")

    def run(self, tool: ToolSpec, arguments: dict[str, Any], timeout_s: float) -> ToolOutput:
        """Run the command as this kind's user; see ``run_command_tool``."""
        return run_command_tool(
            tool,
            arguments,
            timeout_s,
            user=self.user,
            own_python=self.own_python,
            sandboxing=self.sandboxing,
        )


#: The registered ``command`` kind.
KIND = CommandKind()
