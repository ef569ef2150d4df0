"""One contract per kind of store, run over the in-memory doubles and the Redis stores, on
the fleet's Redis and on the embedded default's private server.

The Redis stores are built the way workers and clients build them, by ``open_stores``
from a real Celery result backend (a real Redis; the home's Valkey on its socket).
"""

from __future__ import annotations

import importlib
import inspect
import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from cleveragents.constants import DEAD_LETTER_KEY
from cleveragents.embedded.server import join_server, leave_server
from cleveragents.embedded.urls import HomeUrls
from cleveragents.errors import ConfigurationError, SkillErrorType
from cleveragents.messages import result_from_stored, result_payload
from cleveragents.runtime.gating import GATE_REQUEST
from cleveragents.runtime.outcomes import failed_result
from cleveragents.settings import Settings
from cleveragents.skills import SkillResult
from cleveragents.stores import (
    Claim,
    MemoryGuardStore,
    MetricCounts,
    RedisBatchLedger,
    RedisGuardStore,
    RedisMetricStore,
    RedisResultStore,
    StartedMark,
    Stores,
    open_stores,
)

#: "redis-worker": a worker's stores, which write many results with one script.
KINDS = ["memory", "embedded", "redis", "redis-worker"]


def celery_backend(url: str) -> Any:
    app = Celery("stores-contract", set_as_current=False)
    app.conf.update(
        result_backend=url,
        result_serializer="json",
        result_accept_content=["json"],
        result_expires=3600,
    )
    return app.backend


@pytest.fixture(params=KINDS)
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stores]:
    settings = Settings.from_env({"CLEVERAGENTS_HOME": str(tmp_path / "home")})
    if request.param == "memory":
        yield Stores.in_memory(marks_redeliveries=False)
    elif request.param == "embedded":
        join_server(settings.home)
        try:
            yield open_stores(settings, celery_backend(HomeUrls.of(settings.home).backend))
        finally:
            leave_server(settings.home)
    else:
        backend = celery_backend(request.getfixturevalue("redis_url"))
        yield open_stores(settings, backend, worker=request.param == "redis-worker")


def ok(text: str = "x") -> SkillResult:
    return SkillResult(
        skill_name="s/k", tool_name="t/l", success=True, output_data={"text": text}, duration_ms=1.5
    )


def refused_for_writes() -> SkillResult:
    return failed_result(
        "s/k",
        "t/w",
        SkillErrorType.PERMISSION_DENIED,
        "writes not allowed",
        {"gates": [GATE_REQUEST]},
    )


# --- the factory -------------------------------------------------------------------


def test_the_factory_chooses_redis_stores_beside_a_redis_backend(redis_url: str) -> None:
    settings = Settings.from_env({"CLEVERAGENTS_BROKER_URL": redis_url})
    chosen = open_stores(settings, celery_backend(redis_url))
    assert isinstance(chosen.guard, RedisGuardStore)
    assert isinstance(chosen.results, RedisResultStore)
    assert isinstance(chosen.ledger, RedisBatchLedger)
    assert isinstance(chosen.metrics, RedisMetricStore)
    assert chosen.guard.marks_redeliveries


def test_the_factory_refuses_a_result_backend_that_is_not_a_redis(tmp_path: Path) -> None:
    (tmp_path / "results").mkdir()
    settings = Settings.from_env({"CLEVERAGENTS_HOME": str(tmp_path)})
    with pytest.raises(ConfigurationError, match="must be a Redis"):
        open_stores(settings, celery_backend(f"file://{tmp_path / 'results'}"))


@pytest.mark.parametrize(
    ("broker", "marks"),
    [("", True), ("redis://h:6379/0", True), ("amqp://guest@h//", True), ("memory://", False)],
)
def test_whether_redeliveries_are_marked_is_the_brokers_to_say(
    broker: str, marks: bool, redis_url: str
) -> None:
    # The embedded default ("") is a Redis: its transport marks them as the fleet's does.
    settings = Settings.from_env({"CLEVERAGENTS_BROKER_URL": broker})
    assert open_stores(settings, celery_backend(redis_url)).guard.marks_redeliveries is marks


# --- guard store -------------------------------------------------------------------


def test_attempts_count_up_per_request_id(stores: Stores) -> None:
    assert [stores.guard.attempt("a/1") for _ in range(3)] == [1, 2, 3]
    assert stores.guard.attempt("b") == 1


def test_a_write_claim_is_taken_once_and_read_back(stores: Stores) -> None:
    mine = Claim.mine(60)
    assert stores.guard.read_claim("w/1") is None
    assert stores.guard.claim("w/1", mine) is None
    other = Claim("elsewhere", 1, time.time() + 60)
    assert stores.guard.claim("w/1", other) == mine
    assert stores.guard.claim("w/1", Claim.mine(60)) == mine  # another of this process
    assert stores.guard.claim("w/1", mine) is None  # the same claim again: a retry
    assert stores.guard.read_claim("w/1") == mine
    assert stores.guard.read_claim("w/2") is None


def test_finishing_a_write_records_its_result_in_the_claim(stores: Stores) -> None:
    stores.guard.claim("w", Claim.mine(60))
    payload = result_payload(ok(), "w")
    stores.guard.finish("w", payload)
    claim = stores.guard.read_claim("w")
    assert claim is not None
    assert claim.done == payload
    assert not claim.running()
    assert stores.guard.claim("w", Claim.mine(60)) == claim


def _dead_letters(stores: Stores) -> dict[str, dict[str, Any]]:
    """The dead letters kept where docs/guarantees.md says an operator finds them, by id."""
    guard = stores.guard
    if isinstance(guard, MemoryGuardStore):
        texts = guard.dead
    else:
        assert isinstance(guard, RedisGuardStore)
        texts = [raw.decode() for raw in guard.client.lrange(DEAD_LETTER_KEY, 0, -1)]
    letters = [json.loads(text) for text in texts]
    return {letter["request_id"]: letter for letter in letters}


def test_dead_letters_are_kept_redacted_one_per_poison_invocation(stores: Stores) -> None:
    stores.guard.dead_letter("p-1", {"skill": "s", "tool": "t", "attempts": 3})
    stores.guard.dead_letter("p-2", {"skill": "s", "tool": "u", "attempts": 3})
    assert _dead_letters(stores) == {
        "p-1": {"request_id": "p-1", "skill": "s", "tool": "t", "attempts": 3},
        "p-2": {"request_id": "p-2", "skill": "s", "tool": "u", "attempts": 3},
    }


def test_redis_keeps_its_dead_letters_newest_first_in_one_list(redis_url: str) -> None:
    with redis.Redis.from_url(redis_url) as client:
        guard = RedisGuardStore(client, ttl_s=60)
        guard.dead_letter("p-1", {"attempts": 3})
        guard.dead_letter("p-2", {"attempts": 3})
        kept = [json.loads(raw)["request_id"] for raw in client.lrange(DEAD_LETTER_KEY, 0, -1)]
    assert kept == ["p-2", "p-1"]


# --- result store ------------------------------------------------------------------


def test_a_request_id_is_bound_once_to_its_first_digest(stores: Stores) -> None:
    # The first binding wins; each later one is told the digest the id is bound to
    assert stores.guard.bind([("b-1", "d1"), ("b-2", "d2")]) == [None, None]
    assert stores.guard.bind([("b-1", "d1"), ("b-2", "other"), ("b-3", "d3")]) == [
        "d1",
        "d2",
        None,
    ]
    assert stores.guard.bind([("b-2", "d2")]) == ["d2"]
    assert stores.guard.bind([]) == []
    assert stores.guard.binding("b-2") == "d2"
    assert stores.guard.binding("never-used") is None


class Started:
    """A STARTED mark for ``rid``: counts its writes through the backend, and carries
    its encoded form beside a Redis result store (as a worker's task builds it)."""

    def __init__(self, stores: Stores, rid: str) -> None:
        self.stores, self.rid, self.writes = stores, rid, 0
        self.results = stores.results if isinstance(stores.results, RedisResultStore) else None
        key = None if self.results is None else _text(self.results.key_for(rid))
        value = json.dumps({"status": "STARTED", "result": {"pid": 1}, "task_id": rid})
        self.mark = StartedMark(self._write, key, value, 60)

    def _write(self) -> None:
        self.writes += 1

    def stored(self) -> bool:
        """Whether the mark was stored, by the script or through the backend."""
        if self.writes:
            return True
        if self.results is None:
            return False
        raw = self.results.client.get(self.results.key_for(self.rid))
        return raw is not None and json.loads(raw)["status"] == "STARTED"


def _text(key: str | bytes) -> str:
    return key.decode() if isinstance(key, bytes) else key


def _scripted(stores: Stores) -> bool:
    return isinstance(stores.guard, RedisGuardStore) and stores.guard.scripted


def test_binding_a_free_id_stores_started_with_it(stores: Stores) -> None:
    started = Started(stores, "s-1")
    assert stores.guard.bind_starting("s-1", "d1", started.mark)[:2] == (None, True)
    assert started.stored()
    assert stores.guard.binding("s-1") == "d1"
    # In one round trip where the store can: nothing written through the backend
    assert started.writes == (0 if _scripted(stores) else 1)


def test_an_id_bound_to_other_content_stores_no_started(stores: Stores) -> None:
    stores.guard.bind([("s-2", "d1")])
    started = Started(stores, "s-2")
    assert stores.guard.bind_starting("s-2", "other", started.mark)[:2] == ("d1", False)
    assert not started.stored()


def test_an_id_bound_to_the_same_content_stores_started_only_where_nothing_finished(
    stores: Stores,
) -> None:
    stores.guard.bind([("s-3", "d1"), ("s-4", "d1")])
    stores.results.put_many([("s-4", ok("four"))])
    running, finished = Started(stores, "s-3"), Started(stores, "s-4")
    # Nothing finished under s-3: a worker's Redis store marks it in the same round
    # trip; the others leave that to the caller, who reads the results first
    assert stores.guard.bind_starting("s-3", "d1", running.mark)[:2] == ("d1", _scripted(stores))
    assert running.stored() == _scripted(stores)
    # A finished result is never overwritten
    assert stores.guard.bind_starting("s-4", "d1", finished.mark)[:2] == ("d1", False)
    assert stores.results.get_payloads(["s-4"]) == [result_payload(ok("four"), "s-4")]


def test_a_worker_gives_its_producers_binding_a_time_to_live(redis_url: str) -> None:
    # A producer binds with SETNX (no time to live); each of the worker's two
    # scripts, the chunk's bind and a single's bind with STARTED, gives it one
    settings = Settings.from_env({})
    producer = open_stores(settings, celery_backend(redis_url))
    worker = open_stores(settings, celery_backend(redis_url), worker=True)
    assert isinstance(worker.guard, RedisGuardStore)
    assert worker.guard.scripted
    producer.guard.bind([("t-1", "d1"), ("t-2", "d2")])
    client = redis.Redis.from_url(redis_url)
    assert [client.ttl(f"cleveragents:bind:{rid}") for rid in ("t-1", "t-2")] == [-1, -1]
    assert worker.guard.bind([("t-1", "d1")]) == ["d1"]
    assert worker.guard.bind_starting("t-2", "d2", Started(worker, "t-2").mark)[:2] == (
        "d2",
        True,
    )
    for rid, digest in (("t-1", "d1"), ("t-2", "d2")):
        assert 0 < client.ttl(f"cleveragents:bind:{rid}") <= worker.guard.ttl
        assert worker.guard.binding(rid) == digest


def test_a_stored_success_is_never_overwritten_by_started(stores: Stores) -> None:
    stores.results.put_many([("s-5", ok("five"))])
    started = Started(stores, "s-5")
    before, _, _ = stores.guard.bind_starting("s-5", "d1", started.mark)
    assert before is None
    assert stores.results.get_payloads(["s-5"]) == [result_payload(ok("five"), "s-5")]


def test_results_are_stored_and_read_back_in_order(stores: Stores) -> None:
    failure = failed_result("s/k", "t/l", SkillErrorType.VALIDATION_ERROR, "bad", {"path": "x"})
    stores.results.put_many([("r-1", ok("one")), ("r-2", failure)])
    got = stores.results.get_payloads(["r-2", "missing", "r-1"])
    assert got[1] is None
    assert got[0] == result_payload(failure, "r-2")
    assert got[2] == result_payload(ok("one"), "r-1")
    assert stores.results.get_payloads([]) == []


def test_forgotten_results_are_gone(stores: Stores) -> None:
    stores.results.put_many([("f-1", ok()), ("f-2", ok())])
    stores.results.forget(["f-1"])
    stores.results.forget([])
    assert [p is None for p in stores.results.get_payloads(["f-1", "f-2"])] == [True, False]


def test_a_refusal_for_writes_does_not_answer_the_request_sent_again_with_writes(
    stores: Stores,
) -> None:
    stores.results.put_many([("g-1", refused_for_writes()), ("g-2", ok())])
    # Without writes the refusal is the answer; with writes it runs again
    assert stores.results.reusable(["g-1"], [False])[0] is not None
    assert stores.results.reusable(["g-1", "g-2"], [True, True]) == [
        None,
        result_payload(ok(), "g-2"),
    ]
    # and the refusal stays, for the worker to replace: a reader deletes nothing
    assert stores.results.get_payloads(["g-1"])[0] is not None


def test_stored_results_read_like_any_celery_task_result(
    redis_url: str, tmp_path: Path
) -> None:
    backend = celery_backend(redis_url)
    chosen = open_stores(Settings.from_env({"CLEVERAGENTS_HOME": str(tmp_path)}), backend)
    failure = refused_for_writes()
    chosen.results.put_many([("c-ok", ok()), ("c-bad", failure)])
    for rid, expected, status in (("c-ok", ok(), "SUCCESS"), ("c-bad", failure, "FAILURE")):
        meta = backend.get_task_meta(rid)
        assert meta["status"] == status
        assert result_from_stored(meta["result"], rid) == expected


# --- batch ledger ------------------------------------------------------------------


def test_a_batch_ledger_keeps_its_meta_and_ids_in_order(stores: Stores) -> None:
    assert stores.ledger.meta("b-1") is None
    assert list(stores.ledger.ids("b-1")) == []
    stores.ledger.set_meta("b-1", {"total": None, "source": "f.jsonl"})
    stores.ledger.set_meta("b-1", {"total": 3, "source": "f.jsonl"})
    assert stores.ledger.meta("b-1") == {"total": 3, "source": "f.jsonl"}
    stores.ledger.append("b-1", ["r-1", "r-2"])
    stores.ledger.append("b-1", [])
    stores.ledger.append("b-1", ["r-3"])
    assert list(stores.ledger.ids("b-1")) == ["r-1", "r-2", "r-3"]


def test_a_long_batch_ledger_reads_back_whole(stores: Stores) -> None:
    ids = [f"id-{i:06d}" for i in range(10_050)]  # past one Redis page
    stores.ledger.append("big", ids[:6000])
    stores.ledger.append("big", ids[6000:])
    assert list(stores.ledger.ids("big")) == ids


def test_a_batch_ledger_keeps_the_results_of_lines_refused_before_sending(
    stores: Stores,
) -> None:
    bad = failed_result("", "", SkillErrorType.VALIDATION_ERROR, "not JSON", {"line": 2})
    stores.ledger.append("r-batch", ["sent", "bad-2", "bad-3"])
    stores.ledger.refuse("r-batch", [("bad-2", result_payload(bad, "bad-2"))])
    stores.ledger.refuse("r-batch", [("bad-3", result_payload(bad, "bad-3"))])
    stores.ledger.refuse("r-batch", [])
    assert stores.ledger.refusals("r-batch", ["bad-3", "sent", "bad-2"]) == [
        result_payload(bad, "bad-3"), None, result_payload(bad, "bad-2")
    ]
    # Kept in the ledger only: no result is stored, and another batch has none
    assert stores.results.get_payloads(["bad-2"]) == [None]
    assert stores.ledger.refusals("other-batch", ["bad-2"]) == [None]
    assert stores.ledger.refusals("r-batch", []) == []


# --- metric store ------------------------------------------------------------------


def test_metric_counts_add_up(stores: Stores) -> None:
    one = MetricCounts()
    one.invocations[json.dumps(["s", "t", "success", ""])] += 2
    one.durations[json.dumps(["s", "t", "0.01"])] += 2
    one.sums[json.dumps(["s", "t"])] = 0.5
    stores.metrics.add(one)
    stores.metrics.add(one)
    totals = stores.metrics.totals()
    assert totals.invocations == {json.dumps(["s", "t", "success", ""]): 4}
    assert totals.durations == {json.dumps(["s", "t", "0.01"]): 4}
    assert totals.sums == {json.dumps(["s", "t"]): pytest.approx(1.0)}


def test_a_count_of_zero_makes_its_series_exist(
    stores: Stores,
) -> None:
    zero = MetricCounts()
    zero.invocations[json.dumps(["s", "t", "success", "", ""])] += 0
    zero.sums[json.dumps(["s", "t", "success"])] = 0.0
    stores.metrics.add(zero)
    totals = stores.metrics.totals()
    assert totals.invocations == {json.dumps(["s", "t", "success", "", ""]): 0}
    assert totals.sums == {json.dumps(["s", "t", "success"]): 0.0}


# --- one retry policy --------------------------------------------------------------


class Flaky:
    """A Redis client whose every method fails once with a connection error, then works."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.failed: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        if name == "connection_pool":  # commands packed by the stores themselves (stores/resp.py)
            return FlakyPool(self.client.connection_pool, self.failed)
        method = getattr(self.client, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            if name not in self.failed:
                self.failed.add(name)
                raise redis.ConnectionError(f"{name}: connection lost (test)")
            return method(*args, **kwargs)

        return call


class FlakyPool:
    """A connection pool whose first connection is lost on the way, then works."""

    def __init__(self, pool: Any, failed: set[str]) -> None:
        self.pool = pool
        self.failed = failed

    def get_connection(self) -> Any:
        if "connection_pool" not in self.failed:
            self.failed.add("connection_pool")
            raise redis.ConnectionError("connection lost (test)")
        return self.pool.get_connection()

    def release(self, connection: Any) -> None:
        self.pool.release(connection)


def test_every_redis_store_rides_out_a_lost_connection(redis_url: str) -> None:
    with redis.Redis.from_url(redis_url) as real:
        guard = RedisGuardStore(Flaky(real), ttl_s=60)
        assert guard.attempt("a") == 1
        assert guard.claim("w", Claim.mine(60)) is None
        guard.finish("w", result_payload(ok(), "w"))
        guard.dead_letter("p", {"attempts": 3})
        assert [json.loads(raw)["request_id"] for raw in real.lrange(DEAD_LETTER_KEY, 0, -1)] == [
            "p"
        ]
        ledger = RedisBatchLedger(Flaky(real), 60)
        ledger.set_meta("b", {"total": 1})
        ledger.append("b", ["r"])
        assert list(RedisBatchLedger(Flaky(real), 60).ids("b")) == ["r"]
        results = RedisResultStore(Flaky(real), lambda rid: f"celery-task-meta-{rid}", 60)
        results.put_many([("r", ok())])
        assert results.get_payloads(["r"])[0] is not None
        metrics = RedisMetricStore(Flaky(real))
        metrics.add(MetricCounts(invocations=Counter({"k": 1})))
        assert RedisMetricStore(Flaky(real)).totals().invocations == {"k": 1}


# --- public surface ----------------------------------------------------------------


@pytest.mark.parametrize("module_name", ["cleveragents.stores", "cleveragents.pipeline"])
def test_the_package_exports_exactly_its_public_members(module_name: str) -> None:
    module = importlib.import_module(module_name)
    public = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not inspect.ismodule(value) and name != "annotations"
    }
    assert set(module.__all__) == public
    assert len(module.__all__) == len(set(module.__all__))
