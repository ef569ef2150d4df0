"""Take a command's own messages back out of the embedded default's queues.

On the embedded default the worker lives and dies with the command that started
it. When the last command stops it, whatever that command sent and no worker has
taken would otherwise wait in the home's server for the next worker: chunks of a
batch that was interrupted. ``withdraw`` removes such messages by their ids, and the
rests of its chunks that the worker sent back after a time slice (new messages,
with new ids) by the batch id they carry; one taken by a worker meanwhile is no
longer in its queue and is left alone.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

from cleveragents.constants import BATCH_HEADER, QUEUE_BATCH, QUEUE_BATCH_WRITE
from cleveragents.embedded.runner import home_client
from cleveragents.settings import Settings

__all__ = ["withdraw"]


def withdraw(
    settings: Settings, message_ids: Collection[str], *, batch_id: str | None = None
) -> int:
    """Remove the waiting batch messages whose id is in ``message_ids``, and the chunks of
    batch ``batch_id`` (the rests a worker requeued among them).

    Returns how many were removed. Does nothing off the embedded default.
    """
    if not settings.embedded or not (message_ids or batch_id):
        return 0
    wanted = set(message_ids)
    client = home_client(settings.home)
    removed = 0
    try:
        for queue in (QUEUE_BATCH, QUEUE_BATCH_WRITE):
            queued: list[Any] = client.lrange(queue, 0, -1)
            for raw in queued:
                message_id, batch = _ids(raw)
                if message_id in wanted or (batch_id is not None and batch == batch_id):
                    removed += int(client.lrem(queue, 1, raw))  # 0: a worker took it
    finally:
        client.close()
    return removed


def _ids(raw: Any) -> tuple[str | None, str | None]:
    """The message's id, and the id of the batch its chunk belongs to (if any)."""
    try:
        headers = json.loads(raw).get("headers") or {}
    except (ValueError, AttributeError):
        return None, None
    if not isinstance(headers, dict):
        return None, None
    value, batch = headers.get("id"), headers.get(BATCH_HEADER)
    batch_id = batch.get("id") if isinstance(batch, dict) else None
    return (
        value if isinstance(value, str) else None,
        batch_id if isinstance(batch_id, str) else None,
    )
