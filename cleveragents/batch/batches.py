"""``SkillClient.batches``: many invocations at once, from one façade.

``run_many`` runs requests in chunks and yields their results in input order;
``submit`` sends them in the background under a batch id; ``status`` and
``results`` read such a batch back. Each is one call into ``batch/api.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sized
from typing import Any

from cleveragents.batch.api import (
    BatchProducer,
    BatchStatus,
    as_items,
    batch_results,
    batch_status,
    results_in_order,
    submit_batch,
)
from cleveragents.batch.api import run_many as run_batch
from cleveragents.batch.gather import Entry
from cleveragents.runtime.request import SkillInvocationRequest
from cleveragents.skills import SkillResult

__all__ = ["Batches"]


class Batches:
    """The batch operations of one client (``client.batches``)."""

    def __init__(self, client: BatchProducer) -> None:
        self.client = client

    def run_many(
        self,
        requests: Iterable[SkillInvocationRequest | Mapping[str, Any]],
        *,
        chunk_size: int | None = None,
        reuse: bool = True,
        batch_id: str | None = None,
    ) -> Iterator[SkillResult]:
        """Run many requests in chunks and yield their results in input order, as they
        are ready.

        Memory stays bounded whatever the number of requests (at most a window of them
        is in flight). A request whose result is already stored is not run again
        (``reuse=False`` runs every request). Flower shows the chunks under ``batch_id``
        (default: a new id) with their item numbers, ``of N`` when ``requests`` has a
        length.
        """
        total = len(requests) if isinstance(requests, Sized) else None
        runner = run_batch(
            self.client,
            as_items(requests),
            reuse=reuse,
            chunk_size=chunk_size,
            batch_id=batch_id,
            total=total,
        )
        return results_in_order(runner)

    def submit(
        self,
        requests: Iterable[SkillInvocationRequest | Mapping[str, Any]],
        *,
        batch_id: str | None = None,
    ) -> tuple[str, int]:
        """Send every request in chunks without waiting: the batch id and the count."""
        return submit_batch(self.client, as_items(requests), batch_id=batch_id)

    def status(self, batch_id: str) -> BatchStatus | None:
        """How far a background batch is (None: no such batch)."""
        return batch_status(self.client, batch_id)

    def results(self, batch_id: str) -> Iterator[Entry]:
        """Every result of a background batch, in input order, waiting for those not done."""
        return batch_results(self.client, batch_id)
