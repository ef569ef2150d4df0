"""Messages a consumer of the embedded broker holds, kept on disk until they are acknowledged.

kombu's filesystem transport moves a message out of the queue folder when a
consumer fetches it and keeps it only in that process's memory until the ack:
a consumer killed in between loses it for good, and with ``acks_late`` that is
every message it was running or had reserved. Here a fetched message is renamed
(atomic on one file system) into a folder its consumer owns::

    broker/queue/<name>.msg            waiting
    broker/inflight/<owner>/<name>.msg held by <owner>, until acked or given back
    broker/inflight/<owner>.lock       flock held by <owner> for as long as it lives

The kernel drops the flock when the owner dies, however it dies, so anyone can
tell a dead owner's folder and rename its messages back into the queue under
their own names (they keep their place in the queue). The folders are 0700 and
the locks 0600, as everything in the home (``cleveragents.embedded.private``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import uuid
from pathlib import Path

from cleveragents.embedded.private import private_folder, private_opener

__all__ = ["HeldMessages", "held_by", "inflight_folder", "live_consumers", "restore_orphans"]

_LOCK = ".lock"


def inflight_folder(queue_folder: str | os.PathLike[str]) -> Path:
    """Where the consumers of ``queue_folder`` keep the messages they hold."""
    return Path(queue_folder).parent / "inflight"


def _owner_is_alive(lock_path: Path) -> bool:
    try:
        handle = open(lock_path, "rb")  # noqa: SIM115 - closed below; the flock is the point
    except FileNotFoundError:
        return False  # an owner creates its lock before its folder: this one is gone
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False  # no process holds it: the owner died (the close drops our lock)


def restore_orphans(queue_folder: str | os.PathLike[str]) -> int:
    """Put every message held by a dead owner back in the queue; return how many."""
    inflight = inflight_folder(queue_folder)
    restored = 0
    try:
        owners = [entry for entry in os.scandir(inflight) if entry.is_dir()]
    except FileNotFoundError:
        return 0
    for owner in owners:
        lock_path = inflight / f"{owner.name}{_LOCK}"
        if _owner_is_alive(lock_path):
            continue
        restored += _move_back(Path(owner.path), Path(queue_folder))
        with contextlib.suppress(OSError):
            os.rmdir(owner.path)
        with contextlib.suppress(FileNotFoundError):
            lock_path.unlink()
    return restored


def live_consumers(queue_folder: str | os.PathLike[str]) -> int:
    """How many live consumers (worker processes fetching from the folder) there are now."""
    try:
        locks = [e for e in os.scandir(inflight_folder(queue_folder)) if e.name.endswith(_LOCK)]
    except FileNotFoundError:
        return 0
    return sum(1 for lock in locks if _owner_is_alive(Path(lock.path)))


def held_by(queue_folder: str | os.PathLike[str], pid: int) -> int:
    """How many messages the live consumers of process ``pid`` hold right now."""
    inflight = inflight_folder(queue_folder)
    try:
        owners = [e for e in os.scandir(inflight) if e.is_dir() and e.name.startswith(f"{pid}-")]
    except FileNotFoundError:
        return 0
    return sum(
        len(_names(Path(owner.path)))
        for owner in owners
        if _owner_is_alive(inflight / f"{owner.name}{_LOCK}")
    )


def _names(folder: Path) -> list[str]:
    try:
        return sorted(os.listdir(folder))
    except FileNotFoundError:  # its owner ended meanwhile
        return []


def _move_back(folder: Path, queue: Path) -> int:
    moved = 0
    for name in _names(folder):
        with contextlib.suppress(FileNotFoundError):  # a concurrent sweep moved it first
            os.rename(folder / name, queue / name)
            moved += 1
    return moved


class HeldMessages:
    """The messages one consumer (a channel in one process) holds, in its own folder."""

    def __init__(self, queue_folder: str | os.PathLike[str]) -> None:
        self.queue = Path(queue_folder)
        inflight = inflight_folder(queue_folder)
        private_folder(inflight)
        owner = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.lock_path = inflight / f"{owner}{_LOCK}"
        # The lock first, then the folder: a sweep never mistakes a new owner for a dead one.
        self._lock = open(self.lock_path, "a+b", opener=private_opener)  # noqa: SIM115 - held for life
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        self.folder = private_folder(inflight / owner)
        self._paths: dict[str, Path] = {}

    def take(self, name: str) -> Path | None:
        """Move message file ``name`` out of the queue into this owner's folder (None: gone)."""
        target = self.folder / name
        try:
            os.rename(self.queue / name, target)
        except OSError:
            return None  # another consumer took it first
        return target

    def track(self, delivery_tag: str, path: Path) -> None:
        """Remember which file holds the message with ``delivery_tag``."""
        self._paths[delivery_tag] = path

    def done(self, delivery_tag: str) -> None:
        """The message was acknowledged (or rejected for good): forget it."""
        path = self._paths.pop(delivery_tag, None)
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def give_back(self, delivery_tag: str) -> bool:
        """Put one held message back in the queue under its own name (False: not held here)."""
        path = self._paths.pop(delivery_tag, None)
        if path is None:
            return False
        with contextlib.suppress(FileNotFoundError):
            os.rename(path, self.queue / path.name)
        return True

    def close(self) -> None:
        """Give back whatever is still held, and end this owner."""
        self._paths.clear()
        _move_back(self.folder, self.queue)
        with contextlib.suppress(OSError):
            self.folder.rmdir()
        with contextlib.suppress(FileNotFoundError):
            self.lock_path.unlink()
        self._lock.close()
