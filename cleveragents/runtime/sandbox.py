"""Sandboxed tools: a command tool or stdio MCP server run under bubblewrap (``bwrap``).

A tool with ``sandbox`` (``cleveragents.skills.policies.Sandbox``), or every
command tool and stdio MCP server of a worker with ``CLEVERAGENTS_SANDBOX=1``,
runs as before under its shepherd, as the tool user, but the program the
shepherd starts is ``bwrap``, which runs the tool with:

- the whole filesystem read-only (``--ro-bind / /``), a fresh ``/dev`` and a
  fresh ``/proc``; the private scratch folder writable (the tool's working
  folder, ``HOME`` and ``TMPDIR``; removed when the call ends); each
  ``allow_write`` path bound writable; each ``deny_read`` path replaced by an
  empty one (a folder: an empty read-only tmpfs; a file: ``/dev/null``, which
  cannot be read there);
- its own PID namespace (it sees only its own processes), IPC and UTS
  namespaces, no capabilities, no new privileges (bwrap always sets it), a
  session of its own, and ``--die-with-parent``;
- its own network namespace, loopback only, unless ``network: all``. With a
  list of destinations the worker serves a proxy for it (``sandbox_proxy.py``)
  on a Unix socket in the scratch folder, made ``127.0.0.1:3128`` inside by the
  forwarder (``sandbox_forwarder.py``), and named by ``HTTP_PROXY`` and
  ``HTTPS_PROXY`` (and the lower-case names).

The shepherd's time-out, output cap and tree kill are unchanged: bwrap and what
runs in it are the shepherd's descendants.

A worker checks once (per tool user) that it can make the sandbox, by making
one (``Sandboxing.problem``); a tool that needs one where it cannot be made
fails with ``ToolActivationError`` and ``details["reason"] ==
"sandbox_unavailable"`` (``Sandboxing.require``): it never runs unsandboxed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from cleveragents.errors import ToolActivationError
from cleveragents.runtime.confined import ToolUser
from cleveragents.runtime.sandbox_proxy import open_proxy
from cleveragents.skills import tool_kinds
from cleveragents.skills.model import ToolSpec
from cleveragents.skills.policies import Sandbox

__all__ = [
    "FORWARDER",
    "PROXY_PORT",
    "SANDBOX_FIX",
    "SANDBOX_UNAVAILABLE",
    "Sandboxing",
    "sandboxed_environment",
]

#: The forwarder script, run inside a sandbox whose network is a list of destinations.
FORWARDER = str(Path(__file__).resolve().with_name("sandbox_forwarder.py"))
#: The port of the proxy on the sandbox's own loopback (its network namespace is private).
PROXY_PORT = 3128
#: ``details["reason"]`` of a sandboxed tool this worker cannot sandbox.
SANDBOX_UNAVAILABLE = "sandbox_unavailable"
#: What to do about it, in one line.
SANDBOX_FIX = (
    "install bubblewrap (Debian: apt-get install bubblewrap) or point CLEVERAGENTS_BWRAP at "
    "it, and let the tool user make user namespaces (sysctl kernel.unprivileged_userns_clone=1 "
    "and user.max_user_namespaces > 0; in a container, a seccomp and AppArmor profile that "
    "allows them), or run the tools as root (CLEVERAGENTS_TOOL_USER=root): see "
    "docs/runtime.md, Sandboxed tools"
)
#: The proxy's socket, in the scratch folder.
_SOCKET_NAME = ".sandbox-proxy.sock"
#: How long the check that makes one sandbox may take.
_PROBE_TIMEOUT_S = 20.0
#: The variables that name the proxy inside the sandbox.
_PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")
#: Variables that would send some destinations around the proxy: never passed in.
_NO_PROXY_VARIABLES = ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy")


def _namespaces(policy: Sandbox) -> list[str]:
    words = ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if policy.network != "all":
        words.append("--unshare-net")
    return [*words, "--new-session", "--die-with-parent", "--cap-drop", "ALL"]


def _folders(scratch: str, policy: Sandbox) -> list[str]:
    words = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--bind", scratch, scratch]
    for path in policy.allow_write:
        words += ["--bind-try", path, path]  # a path that does not exist has nothing to bind
    for path in policy.deny_read:  # after allow_write: a denied path inside one stays denied
        if os.path.isdir(path):
            words += ["--tmpfs", path, "--remount-ro", path]
        elif os.path.lexists(path):
            words += ["--ro-bind", "/dev/null", path]
    return [*words, "--chdir", scratch]


@dataclass
class Sandboxing:
    """How this process makes sandboxes: which tools get one, and with which ``bwrap``."""

    #: ``CLEVERAGENTS_SANDBOX``: every command tool and stdio MCP server gets one.
    every_tool: bool = False
    #: ``CLEVERAGENTS_BWRAP``: the program, a path or a name on ``PATH``.
    bwrap: str = "bwrap"
    _verdicts: dict[int | None, tuple[str | None, str | None]] = field(
        default_factory=dict, repr=False
    )
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def policy(self, tool: ToolSpec) -> Sandbox | None:
        """The sandbox ``tool`` runs in (its own, else this worker's default), or None."""
        if tool.sandbox is not None:
            return tool.sandbox
        return Sandbox() if self.every_tool and tool_kinds.sandboxable(tool) else None

    def problem(self, user: ToolUser | None) -> str | None:
        """Why a sandbox cannot be made for ``user`` (None: it can), checked once per user."""
        key = None if user is None else user.uid
        with self._lock:
            if key not in self._verdicts:
                self._verdicts[key] = self._probe(user)
            return self._verdicts[key][1]

    def _program(self) -> str | None:
        return shutil.which(self.bwrap)

    def _probe(self, user: ToolUser | None) -> tuple[str | None, str | None]:
        program = self._program()
        if program is None:
            return None, f"no bubblewrap program {self.bwrap!r} (CLEVERAGENTS_BWRAP)"
        uid, gid = (None, None) if user is None else (user.uid, user.gid)
        groups: list[int] | None = None if user is None else []
        try:
            with tempfile.TemporaryDirectory(prefix="cleveragents-probe-") as scratch:
                os.chmod(scratch, 0o755)  # the tool user's to enter
                folders = _folders(scratch, Sandbox())
                argv = [program, *folders, *_namespaces(Sandbox()), "--", "true"]
                done = subprocess.run(
                    argv,
                    capture_output=True,
                    timeout=_PROBE_TIMEOUT_S,
                    check=False,
                    user=uid,
                    group=gid,
                    extra_groups=groups,
                )
        except (OSError, subprocess.SubprocessError) as exc:
            return program, f"{program} cannot be run: {exc}"
        if done.returncode != 0:
            said = done.stderr.decode(errors="replace").strip().splitlines()
            why = said[-1] if said else f"exit code {done.returncode}"
            return program, f"{program} cannot make a sandbox: {why}"
        return program, None

    def require(self, tool: str, user: ToolUser | None) -> str:
        """The ``bwrap`` path to run ``tool`` with.

        Raises:
            ToolActivationError: no sandbox can be made here (``sandbox_unavailable``).
        """
        problem = self.problem(user)
        program = self._verdicts[None if user is None else user.uid][0]
        if problem is not None or program is None:
            raise ToolActivationError(
                f"tool activation failed for {tool!r}: it runs in a sandbox, and this worker "
                f"cannot make one: {problem}",
                details={"reason": SANDBOX_UNAVAILABLE, "problem": problem, "fix": SANDBOX_FIX},
            )
        return program

    def unserved(self, tools: Iterable[ToolSpec], user: ToolUser | None) -> str | None:
        """One warning naming the sandboxed tools among ``tools`` this worker cannot serve."""
        names = sorted({tool.name for tool in tools if self.policy(tool) is not None})
        if not names:
            return None
        problem = self.problem(user)
        if problem is None:
            return None
        return (
            f"cannot make sandboxes ({problem}): the sandboxed tools {', '.join(names)} will "
            f"fail with sandbox_unavailable; {SANDBOX_FIX}"
        )

    @contextlib.contextmanager
    def wrapped(
        self,
        program: str,
        argv: list[str],
        policy: Sandbox,
        scratch: str,
        *,
        tool: str,
        python: str = sys.executable,
    ) -> Iterator[tuple[list[str], dict[str, str]]]:
        """The argv that runs ``argv`` sandboxed and the variables it needs, while it may run.

        ``program``: the ``bwrap`` of ``require``. ``python``: an interpreter the tool
        user can run (for the forwarder). With a list of destinations, the proxy is
        served until the block ends.
        """
        words = [program, *_folders(scratch, policy), *_namespaces(policy), "--"]
        env = {"HOME": scratch, "TMPDIR": scratch}
        if not policy.proxied:
            yield [*words, *argv], env
            return
        socket_path = os.path.join(scratch, _SOCKET_NAME)
        forwarder = [python, "-I", "-S", FORWARDER, socket_path, str(PROXY_PORT), "--"]
        env.update(dict.fromkeys(_PROXY_VARIABLES, f"http://127.0.0.1:{PROXY_PORT}"))
        with open_proxy(socket_path, policy, tool):
            yield [*words, *forwarder, *argv], env


def sandboxed_environment(env: dict[str, str], added: dict[str, str]) -> dict[str, str]:
    """``env`` for a sandboxed program: ``added`` over it, and no variable that skips the proxy."""
    kept = {k: v for k, v in env.items() if k not in _NO_PROXY_VARIABLES}
    return {**kept, **added}
