"""The embedded default's stores: files under ``CLEVERAGENTS_HOME``, for one machine.

Guard records are files created with ``O_EXCL`` under ``guard/``, batches a
folder each under ``batches/``, results Celery's own file store. Metrics are
dropped: nothing exports them without Redis (``cleveragents metrics`` needs it).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from cleveragents.constants import DEAD_LETTER_LIMIT
from cleveragents.stores.base import (
    Binding,
    Claim,
    MetricCounts,
    StartedMark,
    bind_then_start,
)
from cleveragents.stores.result_meta import KeyValueResults

__all__ = [
    "FileBatchLedger",
    "FileGuardStore",
    "FileResultStore",
    "NullMetricStore",
    "file_name",
]


def file_name(request_id: str) -> str:
    """A file name for any id, one to one: no two ids share a name.

    "/" and "%" are percent-encoded, and a leading "." too, so that "." and ".." name
    files, never the folder or its parent. A name past the file system's limit (ids of
    many "/") is the id's SHA-256 behind "%H", which no encoded name starts with.
    """
    name = request_id.replace("%", "%25").replace("/", "%2F")
    name = "%2E" + name[1:] if name.startswith(".") else name
    if len(name.encode()) > _LONGEST_NAME:
        return "%H" + hashlib.sha256(request_id.encode()).hexdigest()
    return name

#: Room for a name and the suffixes the stores add (".json", ".tmp"), under NAME_MAX (255).
_LONGEST_NAME = 240


def _replace(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically: a reader sees the old file or the new one."""
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(temp, path)


class FileGuardStore:
    """Guard records as files: a counter file per id, ``O_EXCL`` claims, a dead letter per id."""

    def __init__(self, folder: Path, *, marks_redeliveries: bool = False) -> None:
        self.folder = folder
        #: Whether the broker marks redeliveries (the embedded file transport does not:
        #: then every delivery is counted).
        self.marks_redeliveries = marks_redeliveries

    def _path(self, kind: str, request_id: str) -> Path:
        folder = self.folder / kind
        folder.mkdir(parents=True, exist_ok=True)
        return folder / file_name(request_id)

    def attempt(self, request_id: str) -> int:
        """Count one more delivery of ``request_id``; return how many have been counted."""
        with self._path("attempts", request_id).open("a+", encoding="utf-8") as handle:
            handle.write("x")  # one byte per delivery, appended atomically
            handle.seek(0)
            return len(handle.read())

    def claim(self, request_id: str, claim: Claim) -> Claim | None:
        """Take the write claim atomically: None when taken, else the claim already held."""
        path = self._path("write", request_id)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            held = Claim.decode(path.read_text(encoding="utf-8"))
            return None if held.same_as(claim) else held
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(claim.encode())
        return None

    def read_claim(self, request_id: str) -> Claim | None:
        """The write claim of ``request_id``, if any."""
        path = self._path("write", request_id)
        raw = path.read_text(encoding="utf-8") if path.exists() else None
        return Claim.decode(raw) if raw else None

    def finish(self, request_id: str, payload: dict[str, Any]) -> None:
        """Record the result of a claimed write in its claim."""
        self._path("write", request_id).write_text(
            Claim.finished(payload).encode(), encoding="utf-8"
        )

    def dead_letter(self, request_id: str, record: dict[str, Any]) -> None:
        """Keep a poison invocation for inspection, one file per id (the last 10,000)."""
        path = self._path("dead-letter", request_id)
        _replace(path, json.dumps({"request_id": request_id, **record}))
        kept = self._dead_letter_files()
        for old in kept[DEAD_LETTER_LIMIT:]:
            old.unlink(missing_ok=True)

    def _dead_letter_files(self) -> list[Path]:
        folder = self.folder / "dead-letter"
        files = [p for p in folder.iterdir() if not p.name.startswith(".tmp-")]
        stamped = []
        for path in files:
            try:
                stamped.append((path.stat().st_mtime_ns, path.name, path))
            except FileNotFoundError:
                continue  # trimmed by another process meanwhile
        return [path for *_, path in sorted(stamped, reverse=True)]

    def bind(self, pairs: Sequence[tuple[str, str]]) -> list[str | None]:
        """Bind ids to digests: an ``O_EXCL`` file per id, holding its digest."""
        return [self._bind_one(request_id, digest) for request_id, digest in pairs]

    def _bind_one(self, request_id: str, digest: str) -> str | None:
        path = self._path("bind", request_id)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            # One write of a short string: a reader sees all of it or (being written) none.
            return path.read_text(encoding="utf-8") or digest
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(digest)
        return None

    def binding(self, request_id: str) -> str | None:
        """The digest in the id's bind file, if there is one."""
        try:
            return self._path("bind", request_id).read_text(encoding="utf-8") or None
        except FileNotFoundError:
            return None

    def bind_starting(self, request_id: str, digest: str, mark: StartedMark) -> Binding:
        """Bind the id, then store ``mark`` through the backend if it was free."""
        return bind_then_start(self, request_id, digest, mark)

    def cancel(self, request_id: str) -> bool:
        """Nothing: its workers cannot be told (docs/mcp.md, "Cancellation")."""
        return False


class FileResultStore(KeyValueResults):
    """Results in Celery's file result store (any key-value backend), one call per key."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def _read(self, request_ids: Sequence[str]) -> Sequence[Any]:
        return list(self.backend.mget([self.backend.get_key_for_task(i) for i in request_ids]))

    def _write(self, metas: Sequence[tuple[str, dict[str, Any]]]) -> None:
        for rid, meta in metas:
            self.backend.set(self.backend.get_key_for_task(rid), json.dumps(meta))

    def _delete(self, request_ids: Sequence[str]) -> None:
        for rid in request_ids:
            self.backend.delete(self.backend.get_key_for_task(rid))


class FileBatchLedger:
    """A batch as a folder: ``meta.json`` and an ``ids`` file of one id a line."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def set_meta(self, batch_id: str, meta: dict[str, Any]) -> None:
        """Record (or replace) what the batch is: its file, counts, times."""
        folder = self.folder / batch_id
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "meta.json").write_text(json.dumps(meta), encoding="utf-8")

    def meta(self, batch_id: str) -> dict[str, Any] | None:
        """The batch's description, or None when there is no such batch."""
        path = self.folder / batch_id / "meta.json"
        raw = path.read_text(encoding="utf-8") if path.exists() else None
        return json.loads(raw) if raw else None

    def append(self, batch_id: str, request_ids: Sequence[str]) -> None:
        """Add request ids behind those already recorded."""
        if not request_ids:
            return
        folder = self.folder / batch_id
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / "ids").open("a", encoding="utf-8") as handle:
            handle.write("".join(f"{rid}\n" for rid in request_ids))

    def ids(self, batch_id: str) -> Iterator[str]:
        """The batch's request ids, in input order."""
        path = self.folder / batch_id / "ids"
        if path.exists():
            with path.open(encoding="utf-8") as handle:
                yield from (line.rstrip("\n") for line in handle if line.strip())

    def length(self, batch_id: str) -> int:
        """How many request ids the batch's ledger holds."""
        return sum(1 for _ in self.ids(batch_id))

    def seal(self, batch_id: str, seal: str) -> str | None:
        """Make the batch's seal once (an ``O_EXCL`` file): None when made, else the one
        already there."""
        folder = self.folder / batch_id
        folder.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(folder / "seal", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return self.seal_of(batch_id) or ""
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(seal)
        return None

    def seal_of(self, batch_id: str) -> str | None:
        """The batch's seal, if it has one."""
        path = self.folder / batch_id / "seal"
        return path.read_text(encoding="utf-8") if path.exists() else None

    def refuse(self, batch_id: str, payloads: Sequence[tuple[str, dict[str, Any]]]) -> None:
        """Keep the results of lines answered without being sent: a JSON line each."""
        if not payloads:
            return
        folder = self.folder / batch_id
        folder.mkdir(parents=True, exist_ok=True)
        lines = "".join(json.dumps([rid, payload]) + "\n" for rid, payload in payloads)
        with (folder / "refused").open("a", encoding="utf-8") as handle:
            handle.write(lines)

    def refusals(self, batch_id: str, request_ids: Sequence[str]) -> list[dict[str, Any] | None]:
        """The kept result of each id, None where its line was sent."""
        path = self.folder / batch_id / "refused"
        wanted = set(request_ids)
        kept: dict[str, dict[str, Any]] = {}
        if wanted and path.exists():
            with path.open(encoding="utf-8") as handle:
                for line in handle:
                    try:
                        rid, payload = json.loads(line)
                    except ValueError:  # a line being written: not there yet
                        continue
                    if rid in wanted:
                        kept[rid] = payload
        return [kept.get(rid) for rid in request_ids]


class NullMetricStore:
    """The embedded default's metric store: counts are dropped (nothing would export them)."""

    def add(self, counts: MetricCounts) -> None:
        """Drop ``counts``."""

    def totals(self) -> MetricCounts:
        """Nothing: no count is kept."""
        return MetricCounts()
