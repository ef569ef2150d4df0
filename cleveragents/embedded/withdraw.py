"""Take a command's own messages back out of the embedded broker's queue folder.

On the embedded default the worker lives and dies with the command that started
it. When the last command stops it, whatever that command sent and no worker has
taken would otherwise wait on disk for the next worker: chunks of a batch that
was interrupted, or (after a clean run) chunks that arrived after their requests
had finished elsewhere. ``withdraw`` deletes such messages by their ids, and the
rests of its chunks that the worker sent back after a time slice (new messages,
with new ids) by the batch id they carry; one taken by a worker meanwhile is no
longer in the queue folder and is left alone.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Collection
from pathlib import Path

from cleveragents.constants import BATCH_HEADER
from cleveragents.embedded.folders import EmbeddedFolders
from cleveragents.settings import Settings

__all__ = ["withdraw"]


def withdraw(
    settings: Settings, message_ids: Collection[str], *, batch_id: str | None = None
) -> int:
    """Delete the waiting messages of the embedded queue whose id is in ``message_ids``,
    and the chunks of batch ``batch_id`` (the rests a worker requeued among them).

    Returns how many were deleted. Does nothing off the embedded default.
    """
    if not settings.embedded or not (message_ids or batch_id):
        return 0
    wanted = set(message_ids)
    queue = EmbeddedFolders.under(settings.home).queue
    try:
        names = [n for n in os.listdir(queue) if n.endswith(".msg")]
    except FileNotFoundError:
        return 0
    deleted = 0
    for name in names:
        path = Path(queue, name)
        message_id, batch = _ids(path)
        if message_id in wanted or (batch_id is not None and batch == batch_id):
            with contextlib.suppress(FileNotFoundError):  # a worker took it meanwhile
                path.unlink()
                deleted += 1
    return deleted


def _ids(path: Path) -> tuple[str | None, str | None]:
    """The message's id, and the id of the batch its chunk belongs to (if any)."""
    try:
        headers = json.loads(path.read_bytes()).get("headers") or {}
    except (OSError, ValueError, AttributeError):
        return None, None
    if not isinstance(headers, dict):
        return None, None
    value, batch = headers.get("id"), headers.get(BATCH_HEADER)
    batch_id = batch.get("id") if isinstance(batch, dict) else None
    return (
        value if isinstance(value, str) else None,
        batch_id if isinstance(batch_id, str) else None,
    )
