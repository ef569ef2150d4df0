"""The shepherd: one small process per command tool, which leaves nothing of the tool behind.

The command kind runs it as ``python -I -S shepherd.py STATUS_FD PARENT
DEADLINE_S UID GID -- ARGV...`` (the ``mcp`` kind, for a stdio server, with ``-``
for STATUS_FD: no status pipe) (isolated: no ``PYTHONPATH``, no site; C modules
of the standard library only, so it starts in about the time of a bare
interpreter; never imported by the library). It:

1. makes itself a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``), so every
   descendant of the tool that leaves its process group and session (``setsid``,
   a double fork) is reparented to it rather than to init; asks for ``SIGTERM``
   when its parent dies (``PR_SET_PDEATHSIG``); and makes itself non-dumpable;
2. forks the tool, which starts a new session, drops to the tool user when one is
   given (no supplementary groups), restores default signal handling and execs
   the command with the environment the shepherd was given;
3. waits for the tool (its direct child) to exit, for ``SIGTERM`` (the command
   kind stopping it, or its parent dying), or for its own backstop deadline;
4. then kills (``SIGKILL``) every descendant still alive, again until none is
   left, reaps them, and reports.

It reports on the status pipe (``STATUS_FD``), one line each: ``pid N`` once the
tool runs, then, once every descendant is gone, one of ``exit CODE LEFT``,
``signal N LEFT`` or ``stopped - LEFT`` (told to stop, or its deadline), where
LEFT counts the descendants it killed; or ``exec_error TEXT`` when the command
could not be executed.

Signals are taken synchronously (``sigtimedwait`` on a blocked mask), so no
signal can interrupt it half-way through killing the tree.
"""

from __future__ import annotations

import _ctypes
import _signal  # type: ignore[import-not-found]  # the signal module's enums cost ~10 ms
import os
import sys
import time

TYPE_CHECKING = False  # typing costs ~10 ms to import: only the type checker reads it
if TYPE_CHECKING:
    from typing import Any

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
#: Signals the shepherd takes synchronously.
_WAITED = {_signal.SIGCHLD, _signal.SIGTERM}
#: Signals Python sets to "ignore" that a program must not inherit as ignored.
_RESTORED = ("SIGPIPE", "SIGXFSZ", "SIGXFZ")
#: How long the shepherd keeps reaping killed descendants (a process in
#: uninterruptible sleep dies only when its system call returns).
_REAP_S = 1.0


class _Int(_ctypes._SimpleCData):  # type: ignore[type-arg]  # ctypes.c_int, without importing ctypes (~5 ms)
    _type_ = "i"


class _Libc:
    _handle = _ctypes.dlopen(None, os.RTLD_NOW)  # type: ignore[arg-type]  # this program


class _Function(_ctypes.CFuncPtr):  # type: ignore[misc]
    _flags_ = _ctypes.FUNCFLAG_CDECL
    _restype_ = _Int


def _prctl(option: int, value: int) -> bool:
    try:
        function = _Function(("prctl", _Libc()))  # type: ignore[arg-type]
        return int(function(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):  # not Linux: the process group is all there is
        return False


def _report(fd: int | None, *words: object) -> None:
    if fd is None:  # "-": nobody listens (an MCP server's shepherd, told to stop by SIGTERM)
        return
    try:  # noqa: SIM105  (contextlib costs milliseconds to import: this starts per tool)
        os.write(fd, (" ".join(str(w) for w in words) + "\n").encode(errors="replace"))
    except OSError:
        pass  # the command kind has gone: nobody is listening any more


def _exec_tool(config: dict[str, Any], errors: int) -> None:
    """In the forked child: become the tool (never returns)."""
    try:
        os.setsid()
        uid, gid = config["uid"], config["gid"]
        if uid is not None and gid is not None:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
        for name in _RESTORED:
            if hasattr(_signal, name):
                _signal.signal(getattr(_signal, name), _signal.SIG_DFL)
        _signal.pthread_sigmask(_signal.SIG_SETMASK, set())
        _execute(config["argv"], dict(os.environ))
    except BaseException as exc:  # anything: report it, then end this child
        text = f"{type(exc).__name__}: {exc}" if not isinstance(exc, OSError) else str(exc)
        try:
            os.write(errors, text.encode(errors="replace")[:1000])
        finally:
            os._exit(127)


def _execute(argv: list[str], env: dict[str, str]) -> None:
    """``execvpe`` without imports: as another user the interpreter's own library may be closed."""
    program = argv[0]
    if "/" in program:
        os.execve(program, argv, env)
    first: OSError | None = None
    for folder in env.get("PATH", os.defpath).split(os.pathsep):
        try:
            os.execve(os.path.join(folder or ".", program), argv, env)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:  # not permitted here, say: look further, as execvp does
            first = first or exc
    raise first or FileNotFoundError(2, f"{program!r} is not on PATH")


def _start(config: dict[str, Any]) -> tuple[int, str]:
    """Fork the tool; its pid, and why it could not be executed ("" when it was)."""
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        _exec_tool(config, write_end)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 4096):  # EOF once exec succeeds (close-on-exec)
        chunks.append(chunk)
    os.close(read_end)
    return pid, b"".join(chunks).decode(errors="replace")


def _detach_stdio() -> None:
    # The tool holds the pipes now: end-of-file must depend on the tool's processes only.
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)


def _reap(tool: int) -> int | None:
    """Reap every child that has ended; the tool's wait status if it was among them."""
    status = None
    while True:
        try:
            pid, code = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return status
        if pid == 0:
            return status
        if pid == tool:
            status = code


def _wait_for_tool(tool: int, deadline: float) -> tuple[str, object]:
    """How the tool ended: ("exit", code), ("signal", number) or ("stopped", "-")."""
    while True:
        status = _reap(tool)
        if status is not None:
            if os.WIFSIGNALED(status):
                return "signal", os.WTERMSIG(status)
            return "exit", os.waitstatus_to_exitcode(status)
        left = deadline - time.monotonic()
        if left <= 0:
            return "stopped", "-"
        info = _signal.sigtimedwait(_WAITED, left)
        if info is not None and info.si_signo == _signal.SIGTERM:
            return "stopped", "-"


def _processes() -> dict[int, tuple[int, str]]:
    """Every process: pid -> (parent pid, state)."""
    found: dict[int, tuple[int, str]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                raw = handle.read()
        except OSError:
            continue  # gone meanwhile
        fields = raw[raw.rfind(b")") + 2 :].split()
        found[int(name)] = (int(fields[1]), fields[0].decode())
    return found


def _has_children(me: int) -> bool:
    try:
        with open(f"/proc/{me}/task/{me}/children", "rb") as handle:
            return bool(handle.read().strip())
    except OSError:
        return True  # no such file on this kernel: look the slow way


def _living_descendants(me: int) -> list[int]:
    if not _has_children(me):
        return []
    table = _processes()
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found, todo = [], list(children.get(me, []))
    while todo:
        pid = todo.pop()
        if table[pid][1] not in ("Z", "X"):
            found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def _kill_descendants(me: int) -> int:
    """SIGKILL every living descendant until none is left; reap them; how many there were."""
    killed: set[int] = set()
    until = time.monotonic() + _REAP_S
    while (pids := _living_descendants(me)) and time.monotonic() < until:
        for pid in pids:
            try:  # noqa: SIM105  (no contextlib, as above)
                os.kill(pid, _signal.SIGKILL)
            except OSError:
                pass  # gone already
        killed.update(pids)
        _reap(-1)
        time.sleep(0.001)  # let the killed ones die before looking again
    while time.monotonic() < until:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            time.sleep(0.005)
    return len(killed)


def _config(args: list[str]) -> dict[str, Any]:
    status, parent, deadline_s, uid, gid, marker, *argv = args
    if marker != "--" or not argv:
        raise SystemExit("usage: shepherd.py STATUS_FD PARENT DEADLINE_S UID GID -- ARGV...")
    return {
        "status_fd": None if status == "-" else int(status),
        "parent": int(parent),
        "deadline_s": float(deadline_s),
        "uid": None if uid == "-" else int(uid),
        "gid": None if gid == "-" else int(gid),
        "argv": argv,
    }


def main() -> int:
    """Run the tool the command line names (see the module docstring)."""
    config = _config(sys.argv[1:])
    status_fd = config["status_fd"]
    if status_fd is not None:  # the tool must not hold (or write to) the status pipe
        os.set_inheritable(status_fd, False)
    _signal.pthread_sigmask(_signal.SIG_BLOCK, _WAITED)
    me = os.getpid()
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    _prctl(PR_SET_PDEATHSIG, int(_signal.SIGTERM))
    _prctl(PR_SET_DUMPABLE, 0)
    if os.getppid() != config["parent"]:  # the parent died before PDEATHSIG was set
        _report(status_fd, "stopped", "-", 0)
        return 0
    deadline = time.monotonic() + config["deadline_s"]
    tool, exec_error = _start(config)
    if exec_error and status_fd is None:  # no status pipe: the program's stderr says it
        who = "" if config["uid"] is None else f" as uid {config['uid']}"
        _report(2, f"cannot run {config['argv'][0]!r}{who}: {exec_error}")
    _detach_stdio()
    if exec_error:
        _reap(tool)
        _report(status_fd, "exec_error", exec_error.replace("\n", " "))
        return 0
    _report(status_fd, "pid", tool)
    how, value = _wait_for_tool(tool, deadline)
    _report(status_fd, how, value, _kill_descendants(me))
    return 0


if __name__ == "__main__":
    sys.exit(main())
