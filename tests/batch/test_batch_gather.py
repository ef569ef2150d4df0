"""Reading a batch's results in order (cleveragents/batch/gather.py), on the in-memory store."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from cleveragents.batch.api import batch_results, batch_status
from cleveragents.batch.gather import FIRST_READ, READ_BATCH, Entry, OrderedGather
from cleveragents.errors import SkillErrorType
from cleveragents.messages import result_payload
from cleveragents.runtime.gating import GATE_REQUEST
from cleveragents.runtime.outcomes import failed_result
from cleveragents.skills import SkillResult
from cleveragents.stores.memory import MemoryBatchLedger, MemoryResultStore


class CountingStore(MemoryResultStore):
    """The in-memory result store, counting the ids each bulk read asks for."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[int] = []

    def _read(self, request_ids: Sequence[str]) -> Sequence[Any]:
        self.reads.append(len(request_ids))
        return super()._read(request_ids)


def _done(store: MemoryResultStore, ids: Sequence[str]) -> None:
    result = SkillResult(skill_name="s/k", tool_name="t/l", success=True, duration_ms=1.0)
    store.put_many((rid, result) for rid in ids)


def test_bulk_reads_ask_for_about_what_is_ready_and_release_in_order() -> None:
    store = CountingStore()
    gather = OrderedGather(store)
    ids = [f"r-{n}" for n in range(5000)]
    for n, rid in enumerate(ids):
        gather.add(Entry(n + 1, rid))
    # Nothing done yet: a read asks for the fewest ids, not for the whole window
    assert gather.poll() == []
    assert store.reads == [FIRST_READ]
    # The first 10 done: released in order; the next read asks for twice what was found
    _done(store, ids[:10])
    assert [e.request_id for e in gather.poll()] == ids[:10]
    assert store.reads[-1] == FIRST_READ
    assert gather.want == FIRST_READ  # 2 x 10 is below the floor
    # Everything asked for is there, again and again: each read asks for twice as many,
    # up to READ_BATCH
    _done(store, ids[10:])
    released: list[str] = []
    while len(released) < len(ids) - 10:
        released.extend(e.request_id for e in gather.poll())
    assert released == ids[10:]
    assert store.reads[2:5] == [FIRST_READ, 2 * FIRST_READ, 4 * FIRST_READ]
    assert max(store.reads) == READ_BATCH


def test_a_line_sent_with_writes_reads_past_an_earlier_runs_refusal_for_want_of_them() -> None:
    store = MemoryResultStore()
    refusal = failed_result(
        "s/k", "t/w", SkillErrorType.PERMISSION_DENIED, "writes not allowed",
        {"gates": [GATE_REQUEST]},
    )
    store.put_many([("w-1", refusal), ("r-1", refusal)])
    gather = OrderedGather(store)
    gather.add(Entry(1, "r-1"))  # sent without writes: the refusal is its answer
    gather.add(Entry(2, "w-1", writes=True))  # sent again with writes: it is not
    assert [e.request_id for e in gather.poll()] == ["r-1"]
    assert gather.poll() == []
    # Once its worker replaces it with the re-run's result, that is the answer
    _done(store, ["w-1"])
    [entry] = gather.poll()
    assert entry.payload is not None
    assert entry.payload["success"]


def test_a_batch_ledgers_kept_result_never_stands_for_a_stored_one_nor_for_a_success() -> None:
    # The ledger is the producers' own: what a hostile one writes there may only ever
    # read as a refusal of a line no worker answered
    results_store, ledger = MemoryResultStore(), MemoryBatchLedger()
    producer = SimpleNamespace(results=results_store, ledger=ledger)
    refusal = failed_result("s/k", "t/l", SkillErrorType.VALIDATION_ERROR, "not a request", {})
    forged = SkillResult(skill_name="s/k", tool_name="t/l", success=True,
                         output_data={"forged": True}, duration_ms=1.0)
    ledger.set_meta("b", {"batch_id": "b", "source": "", "total": 3})
    ledger.append("b", ["bad", "ran", "forged-success"])
    ledger.refuse("b", [
        ("bad", result_payload(refusal, "bad")),
        ("ran", result_payload(refusal, "ran")),
        ("forged-success", result_payload(forged, "forged-success")),
    ])
    _done(results_store, ["ran", "forged-success"])
    results = {e.request_id: e.payload for e in batch_results(producer, "b")}
    assert results["bad"] == result_payload(refusal, "bad")
    assert results["ran"] is not None
    assert results["ran"]["success"]
    assert results["forged-success"] is not None
    assert "forged" not in (results["forged-success"]["output_data"] or {})
    status = batch_status(producer, "b")
    assert status is not None
    assert (status.done, status.succeeded, status.failed) == (3, 2, 1)
