"""The sandbox's forwarder: the proxy's address inside a sandbox that has no network.

A sandbox whose ``network`` is a list of destinations has a network namespace of
its own, with only a loopback interface: nothing on it can reach the worker's
proxy by TCP. The worker binds the proxy's Unix socket into the sandbox's
scratch folder; this script, the first program run inside (``python -I -S
sandbox_forwarder.py SOCKET PORT -- ARGV...``), listens on ``127.0.0.1:PORT`` of
the sandbox's own loopback, then leaves a detached process that copies every
connection to the socket and back, and execs the tool. The tool finds the proxy
at ``HTTP_PROXY=http://127.0.0.1:PORT``.

The forwarder is not the tool's child (it is orphaned at once, so the sandbox's
init adopts it): a tool that waits for all its children does not wait for it.
It dies with the sandbox: once the tool exits, bubblewrap's init exits, and the
kernel kills every process left in the sandbox's PID namespace.

Standard library only, run isolated (``-I -S``); never imported by the library.
"""

from __future__ import annotations

import os
import socket
import sys
import threading

_CHUNK = 65_536


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(_CHUNK):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for end in (sink, source):
            try:  # noqa: SIM105  (contextlib costs an import in every sandboxed start)
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _relay(client: socket.socket, path: str) -> None:
    proxy = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        proxy.connect(path)
    except OSError:
        client.close()
        proxy.close()
        return
    threading.Thread(target=_pump, args=(proxy, client), daemon=True).start()
    _pump(client, proxy)


def _serve(listener: socket.socket, path: str) -> None:
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # the tool's pipes must reach end-of-file with the tool
        os.dup2(null, fd)
    while True:
        client, _ = listener.accept()
        threading.Thread(target=_relay, args=(client, path), daemon=True).start()


def main() -> int:
    """Listen, leave the forwarder running, and become the tool (see the module docstring)."""
    path, port, marker, *argv = sys.argv[1:]
    if marker != "--" or not argv:
        raise SystemExit("usage: sandbox_forwarder.py SOCKET PORT -- ARGV...")
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", int(port)))
    listener.listen(64)
    child = os.fork()
    if child == 0:
        if os.fork() == 0:
            try:
                _serve(listener, path)
            finally:
                os._exit(0)
        os._exit(0)
    os.waitpid(child, 0)
    listener.close()
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        sys.stderr.write(f"cannot run {argv[0]!r} in the sandbox: {exc}\n")
        return 127
    return 0  # not reached: execvp returned


if __name__ == "__main__":
    sys.exit(main())
