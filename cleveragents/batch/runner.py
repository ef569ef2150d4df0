"""Run many requests: pack them into chunks, skip those already done, yield results in order.

Chunks are ``DEFAULT_CHUNK`` requests: enough that Celery's per-message cost
vanishes for millisecond tools. Neither fairness nor the use of every worker
process depends on the chunk size: a worker runs a chunk for one time slice and
requeues the rest, split by time when it is slow (cleveragents/pipeline/chunk.py).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from cleveragents.batch.gather import Entry, OrderedGather
from cleveragents.batch.source import BatchItem
from cleveragents.constants import MAX_CHUNK_BYTES
from cleveragents.errors import SkillErrorType
from cleveragents.messages import ChunkContext, request_payload, result_payload
from cleveragents.pipeline.binding import reused_result
from cleveragents.runtime.outcomes import failed_result
from cleveragents.runtime.request import SkillInvocationRequest
from cleveragents.stores import ResultStore

#: Binds requests' ids to their content; True where an id was bound to other content.
BindIds = Callable[[Sequence[SkillInvocationRequest]], list[bool]]

__all__ = ["BatchRunner", "invalid_payload"]

#: Requests per chunk message.
DEFAULT_CHUNK = 500
#: How often the window is read past its front, and counted, for progress (``finished``).
LOOK_AHEAD_EVERY_S = 0.5
#: At most this many requests are submitted and not yet written out (bounds memory).
DEFAULT_WINDOW = 20_000
#: Longest pause between two reads of the result store.
MAX_POLL_S = 0.02

#: Publishes one chunk of requests (with their place in the batch); returns the message's id.
SendChunk = Callable[[list[SkillInvocationRequest], ChunkContext], str | None]


def invalid_payload(item: BatchItem) -> dict[str, Any]:
    """The stored form of a line that is not a valid request: a ``validation_error``."""
    result = failed_result(
        item.skill,
        item.tool,
        SkillErrorType.VALIDATION_ERROR,
        item.problem or "invalid request",
        {"line": item.line},
    )
    return result_payload(result, item.request_id)


def reused_payload(request: SkillInvocationRequest) -> dict[str, Any]:
    """The answer to a line whose request id is bound to another request: nothing ran."""
    return result_payload(reused_result(request_payload(request)), request.request_id)


def _size(request: SkillInvocationRequest) -> int:
    # Empty or small arguments are the common case: skip encoding them.
    if not request.arguments:
        return 64
    return 64 + len(json.dumps(request.arguments, separators=(",", ":"), default=str))


class BatchRunner:
    """Submit ``items`` in chunks and yield ``Entry``s (with payloads) in input order."""

    def __init__(
        self,
        items: Iterable[BatchItem],
        store: ResultStore,
        send_chunk: SendChunk,
        *,
        reuse: bool = True,
        window: int = DEFAULT_WINDOW,
        chunk_size: int | None = None,
        bind: BindIds | None = None,
        batch_id: str | None = None,
        total: int | None = None,
    ) -> None:
        self.items = iter(items)
        #: What Flower shows the chunks under, with each request's item number (1-based).
        self.batch_id = batch_id or uuid.uuid4().hex[:16]
        self.total = total
        self.count = 0
        self.store = store
        self.send_chunk = send_chunk
        self.bind = bind
        self.reuse = reuse
        self.window = window
        self.chunk_size = chunk_size or DEFAULT_CHUNK
        self.gather = OrderedGather(store)
        self.buffers: dict[bool, list[tuple[Entry, SkillInvocationRequest]]] = {False: [], True: []}
        self.positions: dict[bool, list[int]] = {False: [], True: []}  # item numbers, as buffers
        self.buffer_bytes: dict[bool, int] = {False: 0, True: 0}
        self.exhausted = False
        self.submitted = 0
        self.reused = 0
        self.stopped = False
        #: Ids of the chunk messages this run sent, in order (one per chunk, not per line).
        self.messages: list[str] = []
        #: Lines yielded so far; when the window was last read ahead and counted.
        self.released = 0
        self._looked_at = self._counted_at = float("-inf")
        self._held = 0
        #: Called while the run waits for the line whose turn it is (a progress bar).
        self.on_idle: Callable[[], None] | None = None

    def stop(self) -> None:
        """End the run: submit nothing more and yield nothing more (Ctrl-C).

        What was submitted still runs and is stored; running the batch again reuses it.
        """
        self.stopped = True

    def _flush(self, writes: bool) -> None:
        buffer, positions = self.buffers[writes], self.positions[writes]
        if not buffer:
            return
        self.buffers[writes], self.positions[writes] = [], []
        self.buffer_bytes[writes] = 0
        if self.bind is not None:  # an id bound to another request gets no one's result
            reused = self.bind([request for _, request in buffer])
            for (entry, request), refused in zip(buffer, reused, strict=True):
                if refused:
                    entry.payload = reused_payload(request)
            buffer = [pair for pair, refused in zip(buffer, reused, strict=True) if not refused]
            positions = [n for n, refused in zip(positions, reused, strict=True) if not refused]
        if self.reuse and buffer:
            ids = [entry.request_id for entry, _ in buffer]
            writes_allowed = [request.allow_writes for _, request in buffer]
            payloads = self.store.reusable(ids, writes_allowed)
            for (entry, _), payload in zip(buffer, payloads, strict=True):
                entry.payload = payload
        todo = [
            (request, n)
            for (entry, request), n in zip(buffer, positions, strict=True)
            if entry.payload is None
        ]
        self.reused += len(buffer) - len(todo)
        if todo:
            context = ChunkContext(self.batch_id, tuple(n for _, n in todo), self.total)
            message = self.send_chunk([request for request, _ in todo], context)
            if message is not None:
                self.messages.append(message)
            self.submitted += len(todo)

    def _fill(self) -> None:
        window = self.window
        while not self.exhausted and not self.stopped and len(self.gather) < window:
            item = next(self.items, None)
            if item is None:
                self.exhausted = True
                break
            self.count += 1
            entry = Entry(item.line, item.request_id, item.skill, item.tool)
            self.gather.add(entry)
            if item.request is None:
                entry.payload = invalid_payload(item)
                continue
            writes = entry.writes = item.request.allow_writes
            self.buffers[writes].append((entry, item.request))
            self.positions[writes].append(self.count)
            self.buffer_bytes[writes] += _size(item.request)
            if (
                len(self.buffers[writes]) >= self.chunk_size
                or self.buffer_bytes[writes] >= MAX_CHUNK_BYTES
            ):
                self._flush(writes)
        if self.exhausted and self.total is None:
            self.total = self.count  # known now: the last chunks say "of N"
        if self.exhausted or len(self.gather) >= window:
            self._flush(False)
            self._flush(True)

    @property
    def finished(self) -> int:
        """Lines with their result, in any order: those yielded, and those found ahead."""
        now = time.monotonic()
        if now - self._counted_at >= LOOK_AHEAD_EVERY_S:
            self._counted_at, self._held = now, self.gather.held()
        return self.released + self._held

    def __iter__(self) -> Iterator[Entry]:
        pause = 0.001
        while not self.stopped:
            self._fill()
            ready = self.gather.release() or self.gather.poll()
            now = time.monotonic()
            if now - self._looked_at >= LOOK_AHEAD_EVERY_S:
                self._looked_at = now
                self.gather.look_ahead()
            if ready:
                self.released += len(ready)
                yield from ready
                pause = 0.001
                continue
            if not self.gather.pending and self.exhausted:
                return
            if self.on_idle is not None:
                self.on_idle()
            time.sleep(pause)
            pause = min(pause * 2, MAX_POLL_S)
