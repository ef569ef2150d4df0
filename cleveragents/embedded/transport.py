"""kombu's filesystem transport, with messages that appear whole.

kombu writes a message file in place, so a worker polling the folder can move
and read it before the producer has finished writing it: a torn message. Here a
message is written under a name no consumer matches, then renamed (atomic on
POSIX) into the queue folder.
"""

from __future__ import annotations

import os
import uuid
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

__all__ = ["Channel", "Transport"]


class Channel(filesystem.Channel):  # type: ignore[misc]
    """A filesystem channel whose ``_put`` is atomic."""

    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = os.path.join(self.data_folder_out, f".{name}.part")
        try:
            with open(partial, "wb") as handle:
                handle.write(str_to_bytes(dumps(payload)))
            os.rename(partial, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):  # type: ignore[misc]
    """The filesystem transport with atomic puts."""

    Channel = Channel
