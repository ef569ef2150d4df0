"""kombu's filesystem transport, with messages that appear whole and are never lost in flight.

kombu writes a message file in place, so a worker polling the folder can move
and read it before the producer has finished writing it: a torn message. Here a
message is written under a name no consumer matches, then renamed (atomic on
POSIX) into the queue folder.

kombu also moves a fetched message out to the system's temporary folder, deletes
it, and keeps it only in the consumer's memory until the ack: a worker killed
while it runs or has reserved a message (``acks_late``) loses it for good. Here
a fetched message stays on disk, in a folder its consumer owns, until it is
acknowledged; a dead consumer's messages go back to the queue
(``cleveragents.embedded.inflight``).

kombu writes a message under the umask (0644, for every local user to read);
here it is 0600 whatever the umask (``cleveragents.embedded.private``).
"""

from __future__ import annotations

import os
import uuid
from queue import Empty
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

from cleveragents.embedded.inflight import HeldMessages, restore_orphans
from cleveragents.embedded.private import private_opener

__all__ = ["Channel", "Transport"]

#: How often a consumer gives back the messages of consumers that died.
SWEEP_S = 2.0


class Channel(filesystem.Channel):  # type: ignore[misc]
    """A filesystem channel whose ``_put`` is atomic and private (0600), and whose fetched
    messages stay on disk."""

    _held: HeldMessages | None = None
    _swept_at: float | None = None

    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = os.path.join(self.data_folder_out, f".{name}.part")
        try:
            with open(partial, "wb", opener=private_opener) as handle:
                handle.write(str_to_bytes(dumps(payload)))
            os.rename(partial, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc

    def _get(self, queue: str) -> Any:  # type: ignore[override]
        held = self._holder()
        wanted = f"{queue}.msg"
        for name in sorted(os.listdir(self.data_folder_in)):
            if name.partition(".")[2] != wanted:
                continue
            path = held.take(name)
            if path is None:
                continue
            try:
                payload = loads(bytes_to_str(path.read_bytes()))
            except OSError as exc:
                raise ChannelError(f"Cannot read file {str(path)!r} from queue.") from exc
            held.track(payload["properties"]["delivery_tag"], path)
            return payload
        raise Empty()

    def _holder(self) -> HeldMessages:
        # Only consumers hold messages: a producer's channel never creates a folder.
        if self._held is None:
            self._held = HeldMessages(self.data_folder_in)
        now = monotonic()
        if self._swept_at is None or now - self._swept_at > SWEEP_S:
            self._swept_at = now
            restore_orphans(self.data_folder_in)
        return self._held

    def basic_ack(self, delivery_tag: str, multiple: bool = False) -> None:
        """Acknowledge the message, and delete its file."""
        super().basic_ack(delivery_tag, multiple)
        if self._held is not None:
            self._held.done(delivery_tag)

    def basic_reject(self, delivery_tag: str, requeue: bool = False) -> None:
        """Reject the message: back in the queue (``requeue``), or deleted."""
        super().basic_reject(delivery_tag, requeue=requeue)
        if self._held is not None:
            self._held.done(delivery_tag)  # given back already when requeued

    def _restore(self, message: Any) -> None:
        # kombu restores unacknowledged messages (a warm shutdown, a requeue) by
        # publishing them again: a held message is renamed back instead, keeping
        # its name and so its place in the queue.
        if self._held is not None and self._held.give_back(message.delivery_tag):
            return
        super()._restore(message)

    def close(self) -> None:
        """Close the channel; what it still holds goes back to the queue."""
        super().close()
        if self._held is not None:
            self._held.close()
            self._held = None


class Transport(filesystem.Transport):  # type: ignore[misc]
    """The filesystem transport with atomic, private puts and messages kept on disk until acked."""

    Channel = Channel
