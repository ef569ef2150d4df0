"""Take a command's own messages back out of the embedded broker's queue folder.

On the embedded default the worker lives and dies with the command that started
it. When the last command stops it, whatever that command sent and no worker has
taken would otherwise wait on disk for the next worker: chunks of a batch that
was interrupted, or (after a clean run) chunks that arrived after their requests
had finished elsewhere. ``withdraw`` deletes such messages by their ids; one
taken by a worker meanwhile is no longer in the queue folder and is left alone.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Collection
from pathlib import Path

from cleveragents.embedded.folders import EmbeddedFolders
from cleveragents.settings import Settings

__all__ = ["withdraw"]


def withdraw(settings: Settings, message_ids: Collection[str]) -> int:
    """Delete the waiting messages of the embedded queue whose id is in ``message_ids``.

    Returns how many were deleted. Does nothing off the embedded default.
    """
    if not settings.embedded or not message_ids:
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
        if _message_id(path) in wanted:
            with contextlib.suppress(FileNotFoundError):  # a worker took it meanwhile
                path.unlink()
                deleted += 1
    return deleted


def _message_id(path: Path) -> str | None:
    try:
        headers = json.loads(path.read_bytes()).get("headers") or {}
    except (OSError, ValueError, AttributeError):
        return None
    value = headers.get("id") if isinstance(headers, dict) else None
    return value if isinstance(value, str) else None
