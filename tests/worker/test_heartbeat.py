"""A worker's event heartbeat gives up on a broker that stops answering, instead of waiting.

Celery's heartbeat retries a failed send for ever, on the worker's event loop: once
its connection broke and every new one stalled in its handshake, a worker stood
still for 20 minutes of a RabbitMQ soak. Here a real RabbitMQ behind a proxy that
can cut every connection and then accept new ones without a word.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from celery import Celery
from celery.worker import heartbeat
from kombu.asynchronous.timer import Timer

from cleveragents.worker.consumer import SkillConsumer, check_steps
from cleveragents.worker.heartbeat import BOUNDED_HEART, HEART_STEP, BoundedRetries


class Proxy:
    """A TCP proxy to ``upstream`` that can fall silent: cut all, then accept and say nothing."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.silent = False
        self.accepted_after_cut = 0
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client = self.listener.accept()[0]
            except OSError:
                return
            with self.lock:
                self.sockets.append(client)
                self.accepted_after_cut += 1
                if self.silent:
                    continue  # held open, never answered
            server = socket.create_connection(self.upstream)
            with self.lock:
                self.sockets.append(server)
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for end in (src, dst):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)

    def fall_silent(self) -> None:
        """Cut every connection, and answer none of the next ones."""
        self.cut(silent=True)

    def cut(self, *, silent: bool = False) -> None:
        """Cut every connection (new ones are served unless ``silent``)."""
        with self.lock:
            self.silent = silent
            self.accepted_after_cut = 0
            cut, self.sockets = self.sockets, []
        for end in cut:
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            end.close()

    def close(self) -> None:
        self.listener.close()
        with self.lock:
            for end in self.sockets:
                end.close()


@pytest.fixture
def proxied(rabbit_url: str) -> Iterator[tuple[str, Proxy]]:
    """The test's RabbitMQ virtual host, through a ``Proxy``."""
    parts = urlsplit(rabbit_url)
    proxy = Proxy((parts.hostname or "127.0.0.1", parts.port or 5672))
    netloc = f"{parts.username}:{parts.password}@127.0.0.1:{proxy.port}"
    try:
        yield urlunsplit(parts._replace(netloc=netloc)), proxy
    finally:
        proxy.close()


def _dispatcher(url: str) -> object:
    app = Celery("heartbeat-test", broker=url, set_as_current=False)
    app.conf.broker_connection_timeout = 0.5
    return app.events.Dispatcher(app.connection_for_write(), hostname="hb@test", enabled=True)


def _sent_in_thread(heart: Any) -> threading.Event:
    """Send a heartbeat in a thread of its own; the event is set once the send returns."""
    done = threading.Event()

    def send() -> None:
        heart._send("worker-heartbeat")
        done.set()

    threading.Thread(target=send, daemon=True).start()
    return done


def test_a_heartbeat_after_the_broker_falls_silent_is_buffered_within_seconds(
    proxied: tuple[str, Proxy],
) -> None:
    url, proxy = proxied
    dispatcher = _dispatcher(url)
    heart: Any = heartbeat.Heart(Timer(), BoundedRetries(dispatcher))
    heart._send("worker-heartbeat")  # through: the connection is made and used
    assert not dispatcher._outbound_buffer  # type: ignore[attr-defined]
    proxy.fall_silent()
    assert _sent_in_thread(heart).wait(30), "the heartbeat's send is still retrying after 30 s"
    # The event waits in Celery's offline buffer, sent when the consumer reconnects.
    buffered = [event for event, *_ in dispatcher._outbound_buffer]  # type: ignore[attr-defined]
    assert [event["type"] for event in buffered] == ["worker-heartbeat"]


def test_a_producer_left_on_a_replaced_connection_is_turned_to_a_new_channel(
    proxied: tuple[str, Proxy],
) -> None:
    """The soak's way: kombu retried the declaration on the dead channel for ever."""
    url, proxy = proxied
    dispatcher: Any = _dispatcher(url)
    heart: Any = heartbeat.Heart(Timer(), BoundedRetries(dispatcher))
    heart._send("worker-heartbeat")
    proxy.cut()
    # The connection moves on to a new AMQP connection; the producer keeps its channel.
    dispatcher.connection._connection = None
    dispatcher.connection.declared_entities.clear()
    assert _sent_in_thread(heart).wait(30), "the heartbeat's send is still retrying after 30 s"
    assert proxy.accepted_after_cut <= 4  # stock Celery: hundreds a second, for ever
    assert len(dispatcher._outbound_buffer) == 1
    heart._send("worker-heartbeat")  # through the new channel
    assert len(dispatcher._outbound_buffer) == 1


_STOCK = """
import sys, time
from celery import Celery
from celery.worker import heartbeat
from kombu.asynchronous.timer import Timer
sys.path.insert(0, {tests!r})
from worker.test_heartbeat import Proxy
proxy = Proxy(({host!r}, {port}))
url = {url!r}.replace("PORT", str(proxy.port))
app = Celery("stock", broker=url, set_as_current=False)
app.conf.broker_connection_timeout = 0.5
heart = heartbeat.Heart(Timer(), app.events.Dispatcher(app.connection_for_write(), hostname="s"))
heart._send("worker-heartbeat")
print("through", flush=True)
if {stale!r}:
    proxy.cut()
    heart.eventer.connection._connection = None
    heart.eventer.connection.declared_entities.clear()
else:
    proxy.fall_silent()
heart._send("worker-heartbeat")
print("returned", flush=True)
"""


@pytest.mark.parametrize("stale", [False, True], ids=["silent broker", "replaced connection"])
def test_celerys_own_heartbeat_send_still_retries_for_ever(rabbit_url: str, stale: bool) -> None:
    """Why the step is replaced: the day this fails, Celery bounds it and ours can go."""
    parts = urlsplit(rabbit_url)
    url = urlunsplit(parts._replace(netloc=f"{parts.username}:{parts.password}@127.0.0.1:PORT"))
    tests = str(__import__("pathlib").Path(__file__).resolve().parent.parent)
    script = _STOCK.format(
        tests=tests, host=parts.hostname, port=parts.port or 5672, url=url, stale=stale
    )
    with pytest.raises(subprocess.TimeoutExpired) as stuck:
        subprocess.run(
            [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, timeout=10
        )
    assert b"through" in (stuck.value.stdout or b"")


def test_the_worker_runs_the_bounded_heartbeat_step() -> None:
    steps = SkillConsumer.Blueprint.default_steps
    assert BOUNDED_HEART in steps
    assert HEART_STEP not in steps
    check_steps()  # Celery still lists the step replaced
