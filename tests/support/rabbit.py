"""RabbitMQ for tests: a fresh virtual host per test, made and removed with ``rabbitmqctl``.

The RabbitMQ of this machine (127.0.0.1:5672, user ``guest``) serves every test,
each in a virtual host of its own: queues, messages and consumers of one test
never meet another's, and deleting the virtual host deletes them all. Results
go to the test's Redis (``CLEVERAGENTS_RESULT_BACKEND``), as in production.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

#: Where the tests' RabbitMQ listens, and who they log in as (its default user).
HOST = os.environ.get("CLEVERAGENTS_TEST_RABBITMQ_HOST", "127.0.0.1")
PORT = int(os.environ.get("CLEVERAGENTS_TEST_RABBITMQ_PORT", "5672"))
USER = "guest"
PASSWORD = "guest"
#: Every test virtual host's name starts with this.
VHOST_PREFIX = "cleveragents-test-"


def missing() -> str | None:
    """Why RabbitMQ tests cannot run on this machine, or None when they can."""
    if shutil.which("rabbitmqctl") is None:
        return "rabbitmqctl is not installed: RabbitMQ is not on this machine"
    return None


def listening() -> bool:
    """True when something accepts connections on RabbitMQ's port."""
    with contextlib.suppress(OSError), socket.create_connection((HOST, PORT), timeout=2):
        return True
    return False


@dataclass
class Rabbit:
    """The machine's RabbitMQ: makes virtual hosts, and removes them in the background.

    ``rabbitmqctl`` takes about half a second a call, so the next test's virtual host
    is made while a test runs, and a used one is deleted while the next test runs.
    """

    deleting: list[subprocess.Popen[bytes]] = field(default_factory=list)
    making: tuple[str, subprocess.Popen[bytes]] | None = None

    @contextlib.contextmanager
    def vhost(self) -> Iterator[str]:
        """A new, empty virtual host that ``guest`` may use fully; yields its AMQP URL."""
        name, made = self.making or _make_vhost()
        self.making = None
        _finish(made, f"making virtual host {name}")
        self.making = _make_vhost()
        try:
            yield f"amqp://{USER}:{PASSWORD}@{HOST}:{PORT}/{name}"
        finally:
            self.deleting.append(_delete_vhost(name))

    def close(self) -> None:
        """Delete the virtual host made for a test that never came; wait for every deletion."""
        if self.making is not None:
            name, made = self.making
            self.making = None
            with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
                _finish(made, f"making virtual host {name}")
            self.deleting.append(_delete_vhost(name))
        for proc in self.deleting:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.deleting.clear()


def _make_vhost() -> tuple[str, subprocess.Popen[bytes]]:
    # add_vhost, then set_permissions for guest: one shell, run in the background.
    name = f"{VHOST_PREFIX}{uuid.uuid4().hex[:12]}"
    script = (
        f"rabbitmqctl -q add_vhost {name} && "
        f"rabbitmqctl -q set_permissions -p {name} {USER} '.*' '.*' '.*'"
    )
    proc = subprocess.Popen(["sh", "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return name, proc


def _finish(proc: subprocess.Popen[bytes], what: str) -> None:
    _, err = proc.communicate(timeout=60)
    if proc.returncode != 0:
        raise AssertionError(f"{what} failed: {err.decode(errors='replace').strip()}")


def _delete_vhost(name: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["rabbitmqctl", "-q", "delete_vhost", name],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def queue_state(vhost_url: str, name: str) -> tuple[int, int]:
    """(messages ready, consumers) of queue ``name`` in the virtual host of ``vhost_url``."""
    import kombu

    with kombu.Connection(vhost_url) as connection:
        channel = connection.channel()
        try:
            ok = channel.queue_declare(queue=name, passive=True)  # type: ignore[attr-defined]
            return int(ok.message_count), int(ok.consumer_count)
        finally:
            with contextlib.suppress(Exception):
                channel.close()  # type: ignore[attr-defined]
