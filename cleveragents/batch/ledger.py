"""Where a background batch keeps its request ids, in order, beside the results.

With Redis results: a JSON meta key and a list of ids, expiring with the results.
With the embedded file store: a folder per batch under ``CLEVERAGENTS_HOME/batches``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from cleveragents.constants import BATCH_KEY_PREFIX

__all__ = ["BatchLedger"]

_PAGE = 10_000


class BatchLedger:
    """The ordered request ids and the description of each background batch."""

    def __init__(self, backend: Any, home: Path) -> None:
        client = getattr(backend, "client", None)
        self._redis = client if hasattr(client, "pipeline") else None
        self._expires = int(getattr(backend, "expires", 0) or 0)
        self._folder = home / "batches"

    def _keys(self, batch_id: str) -> tuple[str, str]:
        return f"{BATCH_KEY_PREFIX}{batch_id}", f"{BATCH_KEY_PREFIX}{batch_id}:ids"

    def set_meta(self, batch_id: str, meta: dict[str, Any]) -> None:
        """Record (or replace) what the batch is: its file, counts, times."""
        text = json.dumps(meta)
        if self._redis is not None:
            key, _ = self._keys(batch_id)
            self._redis.set(key, text, ex=self._expires or None)
            return
        folder = self._folder / batch_id
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "meta.json").write_text(text, encoding="utf-8")

    def meta(self, batch_id: str) -> dict[str, Any] | None:
        """The batch's description, or None when there is no such batch."""
        if self._redis is not None:
            raw = self._redis.get(self._keys(batch_id)[0])
        else:
            path = self._folder / batch_id / "meta.json"
            raw = path.read_text(encoding="utf-8") if path.exists() else None
        return json.loads(raw) if raw else None

    def append(self, batch_id: str, request_ids: Sequence[str]) -> None:
        """Add request ids behind those already recorded."""
        if not request_ids:
            return
        if self._redis is not None:
            _, ids_key = self._keys(batch_id)
            with self._redis.pipeline(transaction=False) as pipe:
                pipe.rpush(ids_key, *request_ids)
                if self._expires:
                    pipe.expire(ids_key, self._expires)
                pipe.execute()
            return
        folder = self._folder / batch_id
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / "ids").open("a", encoding="utf-8") as handle:
            handle.write("".join(f"{rid}\n" for rid in request_ids))

    def ids(self, batch_id: str) -> Iterator[str]:
        """The batch's request ids, in input order, a page at a time."""
        if self._redis is not None:
            _, ids_key = self._keys(batch_id)
            start = 0
            while True:
                page = self._redis.lrange(ids_key, start, start + _PAGE - 1)
                if not page:
                    return
                yield from (v.decode() if isinstance(v, bytes) else str(v) for v in page)
                start += len(page)
        path = self._folder / batch_id / "ids"
        if path.exists():
            with path.open(encoding="utf-8") as handle:
                yield from (line.rstrip("\n") for line in handle if line.strip())
