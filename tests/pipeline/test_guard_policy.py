"""The guard's policy and the invocation pipeline, on the in-memory stores: no Redis, no worker.

The tools are the fault suite's (``tests/fixtures/fault_tools.py``): each appends
one line per execution to a file, so a test counts how often a tool really ran.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cleveragents.pipeline import Pipeline, execute, execute_chunk
from cleveragents.pipeline import chunk as chunk_module
from cleveragents.pipeline.chunk import FIRST_GROUP, MAX_GROUP, SLICE_S, STAY_S, TAIL_S
from cleveragents.pipeline.guard import MAX_ATTEMPTS, Claim, Guard
from cleveragents.skills import Catalogue, SkillResult
from cleveragents.stores import MemoryGuardStore, ResultStore, Stores
from tests.support.procs import FIXTURE_SKILLS, wait_until

SKILL = "test/faults"
WRITE, IDEMPOTENT, READ = "test/write-once", "test/write-idempotent", "test/read"


@pytest.fixture(scope="module")
def catalogue() -> Catalogue:
    return Catalogue.from_paths(FIXTURE_SKILLS / "faults.yaml")


def make_pipeline(
    catalogue: Catalogue, stores: Stores, seen: list[tuple[str, SkillResult]] | None = None
) -> Pipeline:
    """A pipeline over ``stores`` that polls a claim every 10 ms and records what it observes."""
    observed = [] if seen is None else seen
    return Pipeline(
        catalogue,
        Guard(stores.guard, poll_s=0.01),
        stores.results,
        observe=lambda rid, result: observed.append((rid, result)),
    )


def body(tool: str, key: str, log: Path, **arguments: Any) -> dict[str, Any]:
    """A request for a fault tool whose request id is ``key``."""
    return {
        "request_id": key,
        "skill": SKILL,
        "tool": tool,
        "arguments": {"path": str(log), "key": key, **arguments},
        "allow_writes": tool != READ,
    }


def runs(log: Path) -> Counter[str]:
    """How many times each key's tool ran."""
    if not log.exists():
        return Counter()
    return Counter(line.split(" ", 1)[0] for line in log.read_text().splitlines())


def reason(result: SkillResult) -> Any:
    return None if result.error is None else result.error.details.get("reason")


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


# --- construction ------------------------------------------------------------------


def test_a_guard_cannot_be_built_without_a_store() -> None:
    with pytest.raises(TypeError):
        Guard()  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="GuardStore"):
        Guard(None)  # type: ignore[arg-type]


# --- claims ------------------------------------------------------------------------


@pytest.mark.parametrize("redelivered", [True, False])
def test_a_second_delivery_of_a_finished_write_returns_its_result_without_running_it(
    catalogue: Catalogue, tmp_path: Path, redelivered: bool
) -> None:
    # Given a write that ran once and recorded its result in its claim
    stores = Stores.in_memory()
    pipeline = make_pipeline(catalogue, stores)
    request = body(WRITE, "w-1", tmp_path / "log")
    first = execute(pipeline, request, request_id="w-1", redelivered=False)
    assert first.success
    assert stores.guard.read_claim("w-1") is not None
    # When the same request id is delivered again (redelivered, or simply sent twice)
    second = execute(pipeline, request, request_id="w-1", redelivered=redelivered)
    # Then the tool did not run again and the answer is the first run's result
    assert runs(tmp_path / "log")["w-1"] == 1
    assert second == first


def test_idempotent_writes_and_reads_take_no_claim_and_simply_run_again(
    catalogue: Catalogue, tmp_path: Path
) -> None:
    stores = Stores.in_memory()
    pipeline = make_pipeline(catalogue, stores)
    for tool, key in ((IDEMPOTENT, "i-1"), (READ, "r-1")):
        request = body(tool, key, tmp_path / "log")
        execute(pipeline, request, request_id=key, redelivered=False)
        execute(pipeline, request, request_id=key, redelivered=True)
        assert runs(tmp_path / "log")[key] == 2
        assert stores.guard.read_claim(key) is None


def test_a_delivery_waits_for_a_live_first_run_until_its_result_is_recorded(
    catalogue: Catalogue, tmp_path: Path
) -> None:
    # Given a write whose first run is still going (it sleeps after writing)
    stores = Stores.in_memory()
    pipeline = make_pipeline(catalogue, stores)
    request = body(WRITE, "w-live", tmp_path / "log", sleep_s=0.6)
    results: dict[str, SkillResult] = {}
    first = threading.Thread(
        target=lambda: results.setdefault(
            "first", execute(pipeline, request, request_id="w-live", redelivered=False)
        )
    )
    first.start()
    wait_until(lambda: stores.guard.read_claim("w-live") is not None, 10, "the first run's claim",
               interval=0.01)
    # When it is handed out again meanwhile (a tool that outlives the visibility timeout)
    started = time.monotonic()
    second = execute(pipeline, request, request_id="w-live", redelivered=True)
    waited = time.monotonic() - started
    first.join(10)
    # Then the second delivery waited for the first run and answers with its result
    assert runs(tmp_path / "log")["w-live"] == 1
    assert second == results["first"]
    assert second.success
    assert waited > 0.3
    # And a live first run is no sign of poison: that delivery was not counted
    assert stores.guard.attempt("w-live") == 1


def test_a_second_delivery_sent_while_the_first_runs_waits_at_the_claim(
    catalogue: Catalogue, tmp_path: Path
) -> None:
    # The same id sent twice at once (not a redelivery): the second finds the claim
    # when the tool is about to start, and waits there for the first run's result.
    stores = Stores.in_memory()
    pipeline = make_pipeline(catalogue, stores)
    request = body(WRITE, "w-twice", tmp_path / "log", sleep_s=0.5)
    results: list[SkillResult] = []
    threads = [
        threading.Thread(
            target=lambda: results.append(
                execute(pipeline, request, request_id="w-twice", redelivered=False)
            )
        )
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert runs(tmp_path / "log")["w-twice"] == 1
    assert len(results) == 2
    assert results[0] == results[1]
    assert results[0].success


@pytest.mark.parametrize(
    "claim",
    [
        pytest.param(lambda: Claim(Claim.mine(0).host, dead_pid(), time.time() + 600), id="dead"),
        pytest.param(lambda: Claim.mine(-1.0), id="past-deadline"),
    ],
)
def test_a_write_whose_first_run_is_gone_is_reported_interrupted_not_run_again(
    catalogue: Catalogue, tmp_path: Path, claim: Any
) -> None:
    # Given a claim whose owner died, or whose deadline passed, before it reported back
    stores = Stores.in_memory()
    assert stores.guard.claim("w-gone", claim()) is None
    pipeline = make_pipeline(catalogue, stores)
    # When the request is delivered again
    result = execute(
        pipeline, body(WRITE, "w-gone", tmp_path / "log"), request_id="w-gone", redelivered=True
    )
    # Then nobody can know whether the write happened: it says so and does not run
    assert not result.success
    assert result.error is not None
    assert result.error.error_type == "tool_execution_failure"
    assert reason(result) == "write_interrupted"
    assert (result.skill_name, result.tool_name) == (SKILL, WRITE)
    assert runs(tmp_path / "log")["w-gone"] == 0


def test_a_claim_of_another_host_is_trusted_until_its_deadline(
    catalogue: Catalogue, tmp_path: Path
) -> None:
    stores = Stores.in_memory()
    stores.guard.claim("w-far", Claim("another-host", 1, time.time() + 0.3))
    pipeline = make_pipeline(catalogue, stores)
    started = time.monotonic()
    result = execute(
        pipeline, body(WRITE, "w-far", tmp_path / "log"), request_id="w-far", redelivered=True
    )
    assert time.monotonic() - started > 0.2  # waited for the deadline, then gave up
    assert reason(result) == "write_interrupted"
    assert runs(tmp_path / "log")["w-far"] == 0


# --- poison messages ---------------------------------------------------------------


def _dead_letters(stores: Stores) -> list[dict[str, Any]]:
    """What the in-memory guard kept as dead letters, newest first."""
    assert isinstance(stores.guard, MemoryGuardStore)
    return [json.loads(text) for text in stores.guard.dead]


def test_redeliveries_are_counted_and_end_as_poison_after_the_limit(
    catalogue: Catalogue, tmp_path: Path
) -> None:
    # Given a broker that marks redeliveries (Redis): a first delivery is not counted
    stores = Stores.in_memory(marks_redeliveries=True)
    pipeline = make_pipeline(catalogue, stores)
    request = body(READ, "p-1", tmp_path / "log")
    outcomes = [
        execute(pipeline, request, request_id="p-1", redelivered=delivery > 1)
        for delivery in range(1, MAX_ATTEMPTS + 3)
    ]
    # Then the first MAX_ATTEMPTS deliveries ran, and every later one is a poison failure
    assert [r.success for r in outcomes] == [True] * MAX_ATTEMPTS + [False, False]
    assert runs(tmp_path / "log")["p-1"] == MAX_ATTEMPTS
    poison = outcomes[MAX_ATTEMPTS]
    assert reason(poison) == "poison_message"
    assert poison.error is not None
    assert poison.error.details["attempts"] == MAX_ATTEMPTS
    assert (poison.skill_name, poison.tool_name) == (SKILL, READ)
    # And its dead letter is kept once, by the delivery that crossed the limit
    assert _dead_letters(stores) == [
        {"request_id": "p-1", "skill": SKILL, "tool": READ, "attempts": MAX_ATTEMPTS}
    ]


def test_a_first_delivery_costs_no_count_where_the_broker_marks_redeliveries(
    catalogue: Catalogue, tmp_path: Path
) -> None:
    stores = Stores.in_memory(marks_redeliveries=True)
    pipeline = make_pipeline(catalogue, stores)
    for key in ("a", "b", "c"):
        execute(pipeline, body(READ, key, tmp_path / "log"), request_id=key, redelivered=False)
    assert stores.guard.attempt("a") == 1  # nothing was counted before


def test_without_marked_redeliveries_every_delivery_is_counted(
    catalogue: Catalogue, tmp_path: Path
) -> None:
    # The embedded transport marks nothing: each interactive delivery counts.
    stores = Stores.in_memory(marks_redeliveries=False)
    pipeline = make_pipeline(catalogue, stores)
    request = body(READ, "p-2", tmp_path / "log")
    outcomes = [
        execute(pipeline, request, request_id="p-2", redelivered=False)
        for _ in range(MAX_ATTEMPTS + 1)
    ]
    assert [r.success for r in outcomes] == [True] * MAX_ATTEMPTS + [False]
    assert reason(outcomes[-1]) == "poison_message"
    assert len(_dead_letters(stores)) == 1


def test_a_message_without_a_request_id_runs_unguarded_and_is_observed(
    catalogue: Catalogue, tmp_path: Path
) -> None:
    stores = Stores.in_memory(marks_redeliveries=False)
    seen: list[tuple[str, SkillResult]] = []
    pipeline = make_pipeline(catalogue, stores, seen)
    for _ in range(MAX_ATTEMPTS + 2):
        result = execute(
            pipeline, body(WRITE, "anon", tmp_path / "log"), request_id="", redelivered=True
        )
        assert result.success
    assert runs(tmp_path / "log")["anon"] == MAX_ATTEMPTS + 2
    assert [rid for rid, _ in seen] == [""] * (MAX_ATTEMPTS + 2)


# --- chunks ------------------------------------------------------------------------


def run_chunk(
    pipeline: Pipeline,
    bodies: list[Any],
    *,
    chunk_id: str = "c-1",
    redelivered: bool = False,
    others_waiting: Callable[[], bool] | None = None,
) -> tuple[dict[str, int], list[list[Any]]]:
    requeued: list[list[Any]] = []

    def requeue(rest: list[Any], start: int, rest_id: str) -> None:
        assert rest == bodies[start : start + len(rest)]  # the place it says
        requeued.append(rest)

    report = execute_chunk(
        pipeline,
        bodies,
        chunk_id=chunk_id,
        redelivered=redelivered,
        requeue=requeue,
        others_waiting=others_waiting,
    )
    return report.as_dict(), requeued


def stored(stores: Stores, ids: list[str]) -> list[SkillResult | None]:
    return [
        None if p is None else SkillResult.model_validate(p)
        for p in stores.results.get_payloads(ids)
    ]


def test_a_chunk_stores_every_result_runs_an_id_once_and_skips_what_is_stored(
    catalogue: Catalogue, tmp_path: Path
) -> None:
    stores = Stores.in_memory()
    seen: list[tuple[str, SkillResult]] = []
    pipeline = make_pipeline(catalogue, stores, seen)
    log = tmp_path / "log"
    bodies = [body(READ, "k-1", log), body(READ, "k-2", log), body(READ, "k-1", log), "junk"]
    report, requeued = run_chunk(pipeline, bodies)
    assert report == {"invocations": 4, "ran": 2, "skipped": 2}
    assert requeued == []
    assert all(r is not None and r.success for r in stored(stores, ["k-1", "k-2"]))
    assert [rid for rid, _ in seen] == ["k-1", "k-2"]
    # Delivered again (a resumed batch): nothing runs twice
    report, _ = run_chunk(pipeline, bodies, chunk_id="c-2")
    assert report == {"invocations": 4, "ran": 0, "skipped": 4}
    assert runs(log) == Counter({"k-1": 1, "k-2": 1})


def test_a_chunk_requeues_what_its_time_slice_left(catalogue: Catalogue, tmp_path: Path) -> None:
    stores = Stores.in_memory()
    pipeline = make_pipeline(catalogue, stores)
    log = tmp_path / "log"
    # Each request takes a sixteenth of the slice: the clock, read after each one, ends
    # the slice after about sixteen; the quick rest goes back whole, as one message
    bodies = [body(READ, f"s-{i:03d}", log, sleep_s=SLICE_S / 16) for i in range(40)]
    report, requeued = run_chunk(pipeline, bodies)
    ran = report["ran"]
    assert 1 <= ran <= 17
    assert requeued == [bodies[ran:]]
    assert all(r is not None for r in stored(stores, [b["request_id"] for b in bodies[:ran]]))
    assert stored(stores, [b["request_id"] for b in bodies[ran:]]) == [None] * (40 - ran)


def _timed_chunk(
    catalogue: Catalogue, tmp_path: Path, count: int, sleep_s: float
) -> tuple[Stores, Pipeline, list[Any]]:
    """Fresh stores, a pipeline over them, and ``count`` reads of ``sleep_s`` each."""
    stores = Stores.in_memory()
    log = tmp_path / "log"
    bodies = [body(READ, f"t-{i:03d}", log, sleep_s=sleep_s) for i in range(count)]
    return stores, make_pipeline(catalogue, stores), bodies


def _answering(answer: bool) -> tuple[list[float], Callable[[], bool]]:
    """An ``others_waiting`` that always gives ``answer``, and when it was asked."""
    asked: list[float] = []

    def others_waiting() -> bool:
        asked.append(time.monotonic())
        return answer

    return asked, others_waiting


def test_a_quick_rest_runs_on_in_its_process_while_nothing_else_waits(
    catalogue: Catalogue, tmp_path: Path
) -> None:
    # Given a chunk of quick requests whose slices end before its last one, and no
    # interactive invocation waiting
    stores, pipeline, bodies = _timed_chunk(catalogue, tmp_path, 40, SLICE_S / 16)
    asked, nothing_waits = _answering(False)

    # When it runs
    report, requeued = run_chunk(pipeline, bodies, others_waiting=nothing_waits)
    # Then it ran whole, in several slices (each end asked), and nothing went back
    assert report == {"invocations": 40, "ran": 40, "skipped": 0}
    assert requeued == []
    assert len(asked) >= 1
    assert all(r is not None for r in stored(stores, [b["request_id"] for b in bodies]))


def test_a_quick_rest_goes_back_when_an_interactive_invocation_waits(
    catalogue: Catalogue, tmp_path: Path
) -> None:
    _, pipeline, bodies = _timed_chunk(catalogue, tmp_path, 40, SLICE_S / 16)
    report, requeued = run_chunk(pipeline, bodies, others_waiting=lambda: True)
    assert report["ran"] < 40
    assert requeued == [bodies[report["ran"] :]]


def test_a_chunk_stays_in_its_process_at_most_stay_s(catalogue: Catalogue, tmp_path: Path) -> None:
    # Given a quick chunk far longer than STAY_S (each request a quarter of a slice)
    count = int(STAY_S / (SLICE_S / 4)) * 3
    _, pipeline, bodies = _timed_chunk(catalogue, tmp_path, count, SLICE_S / 4)
    began = time.monotonic()
    report, requeued = run_chunk(pipeline, bodies, others_waiting=lambda: False)
    # Then its rest went back once it had stayed STAY_S
    assert requeued
    assert [b for piece in requeued for b in piece] == bodies[report["ran"] :]
    assert report["ran"] < count
    assert time.monotonic() - began < STAY_S + 4 * SLICE_S


class LookupSizes:
    """A result store that records how many ids each lookup of stored results asks for."""

    def __init__(self, store: ResultStore) -> None:
        self.store = store
        self.sizes: list[int] = []

    def reusable(self, ids: list[str], *args: Any, **kwargs: Any) -> Any:
        self.sizes.append(len(ids))
        return self.store.reusable(ids, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def _looked_up(catalogue: Catalogue, bodies: list[Any]) -> tuple[dict[str, int], list[int]]:
    stores = Stores.in_memory()
    results = LookupSizes(stores.results)
    pipeline = Pipeline(catalogue, Guard(stores.guard), results)  # type: ignore[arg-type]
    report, _ = run_chunk(pipeline, bodies, others_waiting=lambda: False)
    return report, results.sizes


def test_quick_tools_are_looked_up_in_groups_sized_by_time(
    catalogue: Catalogue, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a chunk of 600 quick requests (a line appended to a file each), and a
    # slice of half a second, so that on a loaded machine too many fit in it
    monkeypatch.setattr(chunk_module, "SLICE_S", 0.5)
    bodies = [body(READ, f"q-{i:03d}", tmp_path / "log") for i in range(600)]
    # When it runs
    report, sizes = _looked_up(catalogue, bodies)
    # Then the first group is FIRST_GROUP, and the next ones fill what is left of the
    # slice at the rate measured: more per round trip, at most MAX_GROUP
    assert report["ran"] > FIRST_GROUP
    assert sizes[0] == FIRST_GROUP
    assert max(sizes) > FIRST_GROUP
    assert max(sizes) <= MAX_GROUP


def test_slower_tools_keep_groups_of_first_group(catalogue: Catalogue, tmp_path: Path) -> None:
    # Given requests that each take a tenth of the slice: at most ten fit in what is
    # left of it, fewer than FIRST_GROUP, so every group is FIRST_GROUP (or the rest)
    bodies = [body(READ, f"m-{i:03d}", tmp_path / "log", sleep_s=TAIL_S / 10) for i in range(80)]
    _, sizes = _looked_up(catalogue, bodies)
    assert all(size <= FIRST_GROUP for size in sizes)


def test_no_invocation_starts_later_than_tail_s_past_the_slice(
    catalogue: Catalogue, tmp_path: Path
) -> None:
    # Given a chunk of 40 instant requests, then 30 that each take 0.8 TAIL_S: the
    # typical invocation (the median) stays instant, so the group's rest looks quick
    log = tmp_path / "log"
    bodies = [body(READ, f"i-{i:03d}", log) for i in range(40)]
    bodies += [body(READ, f"w-{i:03d}", log, sleep_s=TAIL_S * 0.8) for i in range(30)]
    _, pipeline, _ = _timed_chunk(catalogue, tmp_path, 0, 0)
    # When it runs while something else waits (so that its rest goes back)
    began = time.monotonic()
    report, requeued = run_chunk(pipeline, bodies, others_waiting=lambda: True)
    # Then it stopped within TAIL_S past its slice, plus the invocation under way,
    # not at the end of its group; the rest went back
    assert report["ran"] < 40 + 30
    assert requeued == [bodies[report["ran"] :]]
    assert report["ran"] <= 40 + int((SLICE_S + TAIL_S) / (TAIL_S * 0.8)) + 2
    assert time.monotonic() - began < SLICE_S + 2 * TAIL_S + 0.5


def test_a_chunk_stops_at_its_slice_when_an_interactive_invocation_waits(
    catalogue: Catalogue, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a chunk whose group's rest would be quick enough to finish past the slice
    # (a TAIL_S of a second; each request a sixteenth of the slice), and an
    # interactive invocation waiting for this process
    monkeypatch.setattr(chunk_module, "TAIL_S", 1.0)
    _, pipeline, bodies = _timed_chunk(catalogue, tmp_path, 300, SLICE_S / 16)
    asked, waiting = _answering(True)

    # When it runs
    report, requeued = run_chunk(pipeline, bodies, others_waiting=waiting)
    # Then it stopped at the first invocation past its slice (about sixteen ran), not
    # at its group's end, asking once; the rest went back
    assert report["ran"] <= 20
    # (in one message, or a few where this machine ran the slice slowly: ``pieces``)
    assert [body for piece in requeued for body in piece] == bodies[report["ran"] :]
    assert len(asked) == 1


def test_a_chunk_of_more_than_max_chunk_items_sends_the_rest_back_in_pieces_first(
    catalogue: Catalogue, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a raw chunk of far more items than a chunk message may hold: the worker
    # would otherwise weigh every item (its hard time limit) at each of its deliveries
    monkeypatch.setattr(chunk_module, "MAX_CHUNK_ITEMS", 10)
    _, pipeline, bodies = _timed_chunk(catalogue, tmp_path, 35, 0)
    # When it runs
    report, requeued = run_chunk(pipeline, bodies, others_waiting=lambda: False)
    # Then the items past the first ten went back at once, ten at most per message,
    # in order, and the first ten ran
    assert report == {"invocations": 35, "ran": 10, "skipped": 0}
    assert [len(piece) for piece in requeued] == [10, 10, 5]
    assert [b for piece in requeued for b in piece] == bodies[10:]


def test_a_slow_chunk_stops_after_one_invocation_and_goes_back_in_pieces(
    catalogue: Catalogue, tmp_path: Path
) -> None:
    # Given a chunk of ten requests that each take three slices
    stores = Stores.in_memory()
    pipeline = make_pipeline(catalogue, stores)
    log = tmp_path / "log"
    bodies = [body(READ, f"p-{i}", log, sleep_s=SLICE_S * 3) for i in range(10)]
    # When it runs: one invocation fills the slice
    report, requeued = run_chunk(pipeline, bodies)
    assert report["ran"] == 1
    # Then the rest (at least 0.54 s of work) goes back as several messages, in order
    assert len(requeued) >= 2
    assert [b for piece in requeued for b in piece] == bodies[1:]
    assert max(map(len, requeued)) - min(map(len, requeued)) <= 1


def test_a_fresh_chunk_does_not_count_its_items(catalogue: Catalogue, tmp_path: Path) -> None:
    stores = Stores.in_memory(marks_redeliveries=True)
    pipeline = make_pipeline(catalogue, stores)
    run_chunk(pipeline, [body(READ, "f-1", tmp_path / "log")])
    assert stores.guard.attempt("f-1") == 1


@pytest.mark.parametrize("marks_redeliveries", [True, False])
def test_the_rest_of_a_chunk_that_came_back_is_run_with_care_too(
    catalogue: Catalogue, tmp_path: Path, marks_redeliveries: bool
) -> None:
    # Given chunks whose slices end before their last invocation, one of them come back
    stores = Stores.in_memory(marks_redeliveries=marks_redeliveries)
    pipeline = make_pipeline(catalogue, stores)
    log = tmp_path / "log"
    rests: dict[str, list[str]] = {"fresh": [], "back": []}

    def slow(prefix: str) -> list[Any]:
        return [body(READ, f"{prefix}-{i}", log, sleep_s=SLICE_S) for i in range(3)]

    def run(name: str, redelivered: bool) -> None:
        if not marks_redeliveries and redelivered:
            run_chunk(pipeline, [], chunk_id=name)  # its first delivery (which died)
        execute_chunk(
            pipeline,
            slow(name),
            chunk_id=name,
            redelivered=redelivered,
            requeue=lambda rest, start, rest_id: rests[name].append(rest_id),
        )

    run("fresh", False)
    run("back", True)
    # Then the rest of the one that came back is run with care at its first delivery
    # (each of its invocations counted: a poison one among them ends at the limit),
    # and the rest of the fresh one is not (a first delivery costs no count)
    assert rests["fresh"]
    assert rests["back"]
    assert all(pipeline.guard.chunk_redelivered(rid, False) for rid in rests["back"])
    assert not any(pipeline.guard.chunk_redelivered(rid, False) for rid in rests["fresh"])


@pytest.mark.parametrize("marks_redeliveries", [True, False])
def test_a_chunk_that_came_back_counts_each_item_so_only_the_poison_one_ends(
    catalogue: Catalogue, tmp_path: Path, marks_redeliveries: bool
) -> None:
    # Given a chunk holding an invocation that already killed its process often enough
    stores = Stores.in_memory(marks_redeliveries=marks_redeliveries)
    guard_store = stores.guard
    assert isinstance(guard_store, MemoryGuardStore)
    for _ in range(MAX_ATTEMPTS + 1):
        guard_store.attempt("bad")
    pipeline = make_pipeline(catalogue, stores)
    log = tmp_path / "log"
    bodies = [body(READ, "good-1", log), body(READ, "bad", log), body(READ, "good-2", log)]
    # When the chunk comes back (Redis marks it; the embedded broker counts the chunk)
    if marks_redeliveries:
        report, _ = run_chunk(pipeline, bodies, chunk_id="c-9", redelivered=True)
    else:
        run_chunk(pipeline, [], chunk_id="c-9")  # its first delivery (which died)
        report, _ = run_chunk(pipeline, bodies, chunk_id="c-9")
    # Then the poison one ends alone and the others run, each result stored
    assert report == {"invocations": 3, "ran": 3, "skipped": 0}
    good_1, bad, good_2 = stored(stores, ["good-1", "bad", "good-2"])
    assert good_1 is not None
    assert good_1.success
    assert good_2 is not None
    assert good_2.success
    assert bad is not None
    assert reason(bad) == "poison_message"
    assert runs(log) == Counter({"good-1": 1, "good-2": 1})


def test_a_careful_chunk_stores_each_result_before_the_next_runs(
    catalogue: Catalogue, tmp_path: Path
) -> None:
    stores = Stores.in_memory()
    log = tmp_path / "log"
    stored_when_run: list[list[SkillResult | None]] = []

    def observe(rid: str, result: SkillResult) -> None:
        stored_when_run.append(stored(stores, ["c-1", "c-2"]))

    pipeline = Pipeline(catalogue, Guard(stores.guard), stores.results, observe=observe)
    run_chunk(pipeline, [body(READ, "c-1", log), body(READ, "c-2", log)], redelivered=True)
    # When the second ran, the first's result was already stored
    assert stored_when_run[1][0] is not None


def test_this_process_is_alive_for_its_own_claims() -> None:
    assert Claim.mine(60).owner_alive()
    assert Claim(Claim.mine(0).host, os.getpid(), time.time() + 60).running()
