"""A worker's Redis result backend: a state stored in one round trip (result_backend.py).

Against the session's real Redis: what is stored and published is what Celery's own
backend stores, a stored SUCCESS is never overwritten, and only finished states wake
a waiting producer.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery, states

from cleveragents.broker.redis.result_backend import (
    BACKEND_CLASS,
    RedisBackend,
    worker_result_backend,
)
from cleveragents.pipeline import Pipeline
from cleveragents.settings import Settings
from cleveragents.skills import Catalogue
from cleveragents.stores import StartedMark, open_stores
from tests.support.procs import EXAMPLE_SKILLS, wait_until
from tests.support.redis_sends import sends


@pytest.fixture
def backend(redis_url: str) -> Iterator[RedisBackend]:
    app = Celery("t-result-backend", set_as_current=False)
    app.conf.update(
        result_backend=worker_result_backend(redis_url),
        result_expires=600,
        result_serializer="json",
        result_accept_content=["json"],
    )
    made = app.backend
    assert isinstance(made, RedisBackend)
    yield made
    app.close()


def _stored(redis_url: str, task_id: str) -> dict[str, Any]:
    raw = redis.Redis.from_url(redis_url).get(f"celery-task-meta-{task_id}")
    assert raw is not None
    return dict(json.loads(raw))


def test_only_redis_urls_get_the_backend() -> None:
    assert worker_result_backend("redis://h:6379/0") == f"{BACKEND_CLASS}+redis://h:6379/0"
    assert worker_result_backend("rediss://u:p+q@h/1") == f"{BACKEND_CLASS}+rediss://u:p+q@h/1"
    assert worker_result_backend("file:///tmp/results") is None
    assert worker_result_backend(None) is None


def test_a_state_is_stored_in_one_round_trip_with_its_time_to_live(
    redis_url: str, backend: RedisBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = redis.Redis.from_url(redis_url)
    backend.store_result("t1", {"pid": 1}, states.STARTED)  # loads the script
    with sends(monkeypatch) as sent:
        backend.store_result("t1", {"words": 2}, states.SUCCESS)

    assert len(sent) == 1, sent  # Celery's own: a GET, then SET and PUBLISH in a pipeline
    stored = _stored(redis_url, "t1")
    assert (stored["status"], stored["result"], stored["task_id"]) == (
        states.SUCCESS, {"words": 2}, "t1"
    )
    assert 0 < server.ttl("celery-task-meta-t1") <= 600
    assert backend.get_task_meta("t1")["result"] == {"words": 2}  # Celery reads it back


def test_a_stored_success_is_never_overwritten(redis_url: str, backend: RedisBackend) -> None:
    backend.store_result("t2", {"first": True}, states.SUCCESS)
    backend.store_result("t2", {"pid": 2}, states.STARTED)  # a late redelivery
    backend.store_result("t2", {"second": True}, states.SUCCESS)

    assert _stored(redis_url, "t2")["result"] == {"first": True}
    # A failure, or a STARTED, is replaced by what comes after it
    backend.store_result("t3", {"pid": 3}, states.STARTED)
    assert _stored(redis_url, "t3")["status"] == states.STARTED
    backend.store_result("t3", {"ok": 1}, states.SUCCESS)
    assert _stored(redis_url, "t3")["status"] == states.SUCCESS


def test_only_finished_states_are_published(redis_url: str, backend: RedisBackend) -> None:
    channel = "celery-task-meta-t4"
    server = redis.Redis.from_url(redis_url)
    pubsub = server.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
    pubsub.subscribe(channel)
    wait_until(lambda: dict(server.pubsub_numsub(channel)).get(channel.encode()) == 1, 5,
               "the subscription to be in place")
    backend.store_result("t4", {"pid": 4}, states.STARTED)
    backend.store_result("t4", {"ok": 4}, states.SUCCESS)
    # Published after both: whatever the backend published comes before it
    server.publish(channel, json.dumps({"status": "end"}))
    seen: list[str] = []

    def read_to_the_end() -> bool:
        message = pubsub.get_message(timeout=0.5)
        if message is not None:
            seen.append(json.loads(message["data"])["status"])
        return seen[-1:] == ["end"]

    wait_until(read_to_the_end, 10, "the end marker", interval=0)
    pubsub.close()
    server.close()

    assert seen == [states.SUCCESS, "end"]


def test_a_result_stored_after_a_redis_script_flush_still_lands(
    redis_url: str, backend: RedisBackend
) -> None:
    backend.store_result("t5", {"pid": 5}, states.STARTED)
    redis.Redis.from_url(redis_url).script_flush()  # as a restarted Redis has no scripts
    backend.store_result("t5", {"ok": 5}, states.SUCCESS)

    assert _stored(redis_url, "t5")["status"] == states.SUCCESS


def test_a_first_delivery_binds_its_id_and_stores_started_in_one_round_trip(
    redis_url: str, backend: RedisBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A worker's pipeline over this backend, as a pool process builds it
    settings = Settings.from_env({"CLEVERAGENTS_BROKER_URL": redis_url})
    catalogue = Catalogue.from_paths(EXAMPLE_SKILLS)
    pipeline = Pipeline.over(catalogue, open_stores(settings, backend, worker=True))
    body = {"skill": "local/text-tools", "tool": "local/word-count", "arguments": {"text": "a"}}
    rid = f"first-{time.monotonic_ns()}"
    writes: list[str] = []
    key, value, ttl = backend.encoded_state(rid, {"pid": 7}, states.STARTED)
    mark = StartedMark(lambda: writes.append(rid), key, value, ttl)
    pipeline.answered(body, "warm-up", StartedMark(lambda: None, *backend.encoded_state(
        "warm-up", {}, states.STARTED)))  # loads the script

    with sends(monkeypatch) as sent:
        assert pipeline.answered(body, rid, mark) is None

    assert len(sent) == 1, sent  # before: a bind, then a STARTED: two
    assert writes == []
    assert backend.get_task_meta(rid)["status"] == states.STARTED
    assert 0 < redis.Redis.from_url(redis_url).ttl(key) <= 600
    # The same delivery again (a redelivery) runs too, and its STARTED costs nothing more
    with sends(monkeypatch) as sent:
        assert pipeline.answered(body, rid, mark) is None
    assert len(sent) == 1, sent
    # Once finished it is answered by its result, and STARTED is not stored over it
    pipeline.results.put_many([(rid, pipeline.run(body))])
    assert pipeline.answered(body, rid, mark) is not None
    assert backend.get_task_meta(rid)["status"] == states.SUCCESS
    assert writes == []
