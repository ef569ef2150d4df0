"""A TLS front for a plain TCP server, on loopback: RabbitMQ as an ``amqps://`` node.

The machine's RabbitMQ listens on plain 5672 only; this proxy takes TLS connections on
a free port with a certificate signed by a CA the test makes (``rig_ca.make_ca``),
and pipes each to the server. A client that checks the certificate against another
CA, or a name it does not carry, fails its handshake, as against a real TLS listener.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import ssl
import threading
from collections.abc import Iterator

from tests.support.rig_ca import RigCA

__all__ = ["tls_proxy"]


@contextlib.contextmanager
def tls_proxy(ca: RigCA, upstream: tuple[str, int]) -> Iterator[int]:
    """A TLS proxy to ``upstream`` with ``ca``'s server certificate; yields its port."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(ca.cert, ca.key)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)  # the accept loop looks at `stop` this often
    stop = threading.Event()
    thread = threading.Thread(target=_accept, args=(listener, context, upstream, stop),
                              daemon=True, name="tls-proxy")
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def _accept(listener: socket.socket, context: ssl.SSLContext, upstream: tuple[str, int],
            stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            client, _ = listener.accept()
        except TimeoutError:
            continue
        except OSError:
            return
        threading.Thread(target=_serve, args=(client, context, upstream, stop),
                         daemon=True).start()


def _serve(client: socket.socket, context: ssl.SSLContext, upstream: tuple[str, int],
           stop: threading.Event) -> None:
    try:
        client.settimeout(10)
        secure = context.wrap_socket(client, server_side=True)
        secure.setblocking(False)
        server = socket.create_connection(upstream, timeout=10)
        server.setblocking(False)
    except (OSError, ssl.SSLError):  # a handshake the client gave up (a CA it refused)
        client.close()
        return
    _pipe(secure, server, stop)


def _pipe(secure: ssl.SSLSocket, server: socket.socket, stop: threading.Event) -> None:
    peers: dict[socket.socket, socket.socket] = {secure: server, server: secure}
    with selectors.DefaultSelector() as selector:
        for sock in peers:
            selector.register(sock, selectors.EVENT_READ)
        try:
            while not stop.is_set():
                for key, _ in selector.select(timeout=0.2):
                    source = next(sock for sock in peers if sock is key.fileobj)
                    if not _forward(source, peers[source]):
                        return
        finally:
            for sock in peers:
                sock.close()


def _forward(source: socket.socket, target: socket.socket) -> bool:
    try:
        while True:  # an SSL socket may hold more decrypted bytes than one read returns
            data = source.recv(65536)
            if not data:
                return False
            target.setblocking(True)
            target.sendall(data)
            target.setblocking(False)
            if not isinstance(source, ssl.SSLSocket) or not source.pending():
                return True
    except (ssl.SSLWantReadError, BlockingIOError):
        return True
    except OSError:
        return False
