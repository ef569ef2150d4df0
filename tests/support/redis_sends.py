"""Count what a test's Redis clients send: each ``send_packed_command`` is one round trip."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from redis.connection import AbstractConnection

__all__ = ["sends"]


@contextmanager
def sends(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Within the block, every packed command (or pipeline) sent to Redis, in order."""
    sent: list[Any] = []
    send = AbstractConnection.send_packed_command

    def counted(self: AbstractConnection, command: Any, check_health: bool = True) -> None:
        sent.append(command)
        send(self, command, check_health)  # type: ignore[no-untyped-call]

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counted)
    try:
        yield sent
    finally:
        monkeypatch.undo()
