"""The keeper of a home's server: starts it, restarts it if it crashes, stops it when unused.

Run as ``python -m cleveragents.embedded.keeper HOME SOCKET BINARY`` by the first
process that joins the home's server (``cleveragents.embedded.server``), in a
session of its own. It starts the server on the socket only (``--port 0``), with
an append-only file in the home, records its own PID and the server's ``run_id``,
and then waits for the users lock exclusively: once no process holds it shared,
it stops the server (SIGTERM: the append-only file flushed) and ends. A server that
dies meanwhile is started again on the same files, at most ``MAX_RESTARTS`` times
a minute, so a running batch goes on after a crash of its server.
"""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from cleveragents.embedded.server import START_TIMEOUT_S, ServerPaths, ServerRecord

__all__ = ["main", "run_id", "server_command"]

#: How many crashes a minute the keeper starts its server again after.
MAX_RESTARTS = 5


def server_command(binary: str, paths: ServerPaths) -> list[str]:
    """The server's command line: a Unix socket only, private, persistent."""
    return [
        binary,
        *("--port", "0"),  # no TCP port: the socket alone
        *("--unixsocket", str(paths.socket), "--unixsocketperm", "700"),
        *("--dir", str(paths.data)),
        # Every write is logged and fsynced each second; no snapshots beside it.
        *("--appendonly", "yes", "--appendfsync", "everysec", "--save", ""),
        *("--daemonize", "no", "--loglevel", "warning"),
        # As the fleet's Redis must be: nothing a worker relies on is ever evicted.
        *("--maxmemory-policy", "noeviction"),
    ]


def run_id(path: Path) -> str | None:
    """The run id of the server answering on socket ``path``; None while none answers (or
    it loads its data). Plain RESP: a keeper does without a client library's import."""
    with socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(5)
        try:
            conn.connect(str(path))
            conn.sendall(b"*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n")
            reply = _bulk_reply(conn)
        except OSError:
            return None
    for line in reply.decode(errors="replace").splitlines():
        if line.startswith("run_id:"):
            return line.partition(":")[2].strip()
    return None  # an error reply (-LOADING) or a short one


def _bulk_reply(conn: socket.socket) -> bytes:
    """One RESP reply, whole: a bulk string (``$<length>``) read to its end, else its line."""
    reply = b""
    while b"\r\n" not in reply:
        chunk = conn.recv(65536)
        if not chunk:
            return reply
        reply += chunk
    head, _, body = reply.partition(b"\r\n")
    if not head.startswith(b"$") or not head[1:].isdigit():
        return reply  # an error (-LOADING) or a null reply
    while len(body) < int(head[1:]):
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return body


def _started(binary: str, paths: ServerPaths) -> tuple[subprocess.Popen[bytes], str]:
    """Start the server; return it and its run id once it answers."""
    server = subprocess.Popen(server_command(binary, paths), stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and server.poll() is None:
        found = run_id(paths.socket)
        if found:
            return server, found
        time.sleep(0.005)
    server.kill()
    raise SystemExit(f"the embedded server did not start ({binary} exited {server.wait()})")


class _Kept:
    """The server a keeper runs now, and whether it is stopping (one lock for both)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.server: subprocess.Popen[bytes] | None = None
        self.stopping = False

    def stop(self) -> None:
        """Stop for good: the server now (SIGTERM: it flushes its append-only file), and
        none started after."""
        with self.lock:
            self.stopping = True
            if self.server is not None and self.server.poll() is None:
                self.server.terminate()


def _stop_when_unused(paths: ServerPaths, kept: _Kept) -> None:
    users = open(paths.users, "a+b")  # noqa: SIM115 (held until the process ends)
    fcntl.flock(users, fcntl.LOCK_EX)  # no process uses the server any more
    kept.stop()


def _supervise(binary: str, paths: ServerPaths, kept: _Kept) -> None:
    crashes: list[float] = []
    while True:
        with kept.lock:  # a stop waits for a start under way, then ends it
            if kept.stopping:
                return
            kept.server, run_id = _started(binary, paths)
        ServerRecord(os.getpid(), run_id).write(paths.record)
        code = kept.server.wait()
        if kept.stopping:
            return
        now = time.monotonic()
        crashes = [t for t in crashes if now - t < 60] + [now]
        print(f"the embedded server exited ({code}); starting it again", file=sys.stderr)
        if len(crashes) > MAX_RESTARTS:
            raise SystemExit(f"the embedded server exited {len(crashes)} times in a minute")


def main(argv: list[str]) -> None:
    """Keep the server of home ``argv[0]`` on socket ``argv[1]``, run from binary ``argv[2]``."""
    home, socket, binary = Path(argv[0]), Path(argv[1]), argv[2]
    paths = ServerPaths(home / "server", socket)
    kept = _Kept()
    watch = threading.Thread(target=_stop_when_unused, args=(paths, kept), daemon=True)
    watch.start()
    try:
        _supervise(binary, paths, kept)
    finally:
        record = ServerRecord.read(paths.record)
        if record is not None and record.keeper == os.getpid():
            paths.record.unlink(missing_ok=True)


if __name__ == "__main__":
    main(sys.argv[1:])
