"""Where the embedded default's server listens, and the URLs each library names it by.

Pure: naming the socket creates nothing (``cleveragents.embedded.server`` starts the
server and makes its folders).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MAX_SOCKET_PATH", "HomeUrls", "socket_path"]

#: The longest socket path every platform takes (macOS: 104 bytes with its NUL).
MAX_SOCKET_PATH = 100


def socket_path(home: Path) -> Path:
    """The server's socket: in the home, or (when that path is too long for a socket)
    in a private folder of the temporary folder, named after the home."""
    inside = home.resolve() / "server" / "valkey.sock"
    if len(str(inside)) <= MAX_SOCKET_PATH:
        return inside
    digest = hashlib.sha256(str(home.resolve()).encode()).hexdigest()[:20]
    return Path(tempfile.gettempdir()) / f"cleveragents-{os.geteuid()}" / f"{digest}.sock"


@dataclass(frozen=True)
class HomeUrls:
    """The home server's socket, as kombu, Celery and redis-py name it."""

    socket: Path

    @classmethod
    def of(cls, home: Path) -> HomeUrls:
        return cls(socket_path(home))

    @property
    def broker(self) -> str:
        """For the project's Redis transport (``SocketTransport``), which keeps it whole."""
        return f"socket://{self.socket}"

    @property
    def kombu_broker(self) -> str:
        """For kombu's own Redis transport."""
        return f"redis+socket://{self.socket}"

    @property
    def backend(self) -> str:
        """For Celery's Redis result backend."""
        return f"redis+socket://{self.socket}"

    @property
    def client(self) -> str:
        """For redis-py."""
        return f"unix://{self.socket}"
