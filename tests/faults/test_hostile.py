"""Hostile input and secrets: fuzzed messages, pickle, oversized bodies, passwords, leaks."""

from __future__ import annotations

import json
import uuid
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kombu
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cleveragents.client import SkillClient
from cleveragents.constants import MAX_MESSAGE_BYTES, QUEUE_READ, TASK_INVOKE
from cleveragents.settings import Settings
from cleveragents.skills import SkillErrorType
from tests.support.procs import RedisServer, Worker

pytestmark = pytest.mark.timeout(240)

StartWorker = Callable[..., Worker]
SECRET = "sk-live-do-not-leak-7f3a9c"


def _publish(url: str, body: bytes, content_type: str, headers: dict[str, Any]) -> None:
    exchange = kombu.Exchange(QUEUE_READ, type="direct")
    with kombu.Connection(url) as conn:
        conn.Producer().publish(
            body, exchange=exchange, routing_key=QUEUE_READ, headers=headers,
            content_type=content_type, content_encoding="utf-8",
            declare=[kombu.Queue(QUEUE_READ, exchange, routing_key=QUEUE_READ)],
        )


def _headers(task_id: str, task: str = TASK_INVOKE) -> dict[str, Any]:
    return {"lang": "py", "task": task, "id": task_id, "root_id": task_id, "parent_id": None,
            "group": None}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=12,
)
request_like = st.fixed_dictionaries(
    {},
    optional={
        "request_id": st.text(max_size=10) | st.integers(),
        "skill": st.sampled_from(["local/text-tools", "test/basic", "x"]) | json_values,
        "tool": st.sampled_from(["local/word-count", "test/echo"]) | json_values,
        "arguments": json_values,
        "allow_writes": json_values,
        "timeout_s": json_values,
    },
)
bodies = st.one_of(
    st.binary(max_size=200).map(lambda b: ("application/json", b)),
    st.binary(max_size=50).map(lambda b: ("application/x-python-serialize", b)),
    json_values.map(lambda v: ("application/json", json.dumps(v).encode())),
    request_like.map(lambda r: ("application/json", json.dumps([[r], {}, {}]).encode())),
    st.tuples(st.lists(json_values, max_size=3), st.dictionaries(st.text(max_size=5), json_values,
                                                                 max_size=2))
    .map(lambda ak: ("application/json", json.dumps([ak[0], ak[1], {}]).encode())),
    st.text(max_size=30).map(lambda t: ("text/plain", t.encode())),
)

#: What else an attacker's headers may say: another task, compression, the worker's clock.
extra_headers = st.fixed_dictionaries(
    {},
    optional={
        "task": st.sampled_from(
            [TASK_INVOKE, "celery.accumulate", "celery.starmap", "celery.map", "x.y"]
        ),
        "compression": st.sampled_from(["application/x-gzip", "zlib", "bzip2", "nonsense"]),
        "timelimit": st.tuples(st.integers(-1, 5), st.integers(-1, 5)).map(list),
        "eta": st.sampled_from(["2999-01-01T00:00:00+00:00", "not a date", 5]),
        "expires": st.sampled_from(["2000-01-01T00:00:00+00:00", "soon", 1.5]),
        "retries": json_values,
        "shadow": st.text(max_size=10),
    },
)


def _accepted(headers: dict[str, Any]) -> bool:
    return headers["task"] == TASK_INVOKE and "compression" not in headers


@pytest.fixture
def fuzz_target(redis_url: str, start_worker: StartWorker) -> tuple[str, Worker]:
    return redis_url, start_worker(redis_url)


def test_fuzzed_messages_never_stop_a_worker_and_decodable_requests_get_results(
    fuzz_target: tuple[str, Worker], client: SkillClient
) -> None:
    url, worker = fuzz_target
    sent: list[tuple[str, str, bytes, dict[str, Any]]] = []

    @settings(max_examples=120, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.lists(st.tuples(bodies, extra_headers), min_size=1, max_size=3))
    def publish_some(messages: list[tuple[tuple[str, bytes], dict[str, Any]]]) -> None:
        for (content_type, body), extra in messages:
            task_id = f"fuzz-{uuid.uuid4()}"
            headers = {**_headers(task_id), **extra}
            if "compression" in headers and headers["compression"] == "application/x-gzip":
                body = zlib.compress(body)
            _publish(url, body, content_type, headers)
            sent.append((task_id, content_type, body, headers))

    publish_some()
    # The worker still serves: a good request after all the junk gets its result.
    good = client.submit("local/text-tools", "local/word-count", {"text": "still serving"})
    try:
        assert good.result(timeout=60).output_data == {"words": 2}
    except TimeoutError:
        pytest.fail(f"the worker stopped serving; log tail:\n{worker.log_text()[-4000:]}")
    assert worker.alive()
    # Every message got a SkillResult under its id: a decodable request its outcome, the rest
    # a validation_error (pickle and other content types are refused undecoded, and so are
    # other task names and compressed bodies).
    for task_id, content_type, body, headers in sent:
        try:
            result = client.wait(task_id, timeout=30)
        except TimeoutError:
            pytest.fail(f"no result for {content_type} {body!r}; log:\n{worker.log_text()[-3000:]}")
        if content_type != "application/json" or not _accepted(headers):
            assert result.error is not None
            assert result.error.error_type == SkillErrorType.VALIDATION_ERROR
        try:
            json.loads(body)
        except ValueError:
            assert result.error is not None
            assert result.error.error_type == SkillErrorType.VALIDATION_ERROR


def test_a_pickled_body_is_refused_without_being_unpickled(
    redis_url: str, start_worker: StartWorker, client: SkillClient, tmp_path: Path
) -> None:
    start_worker(redis_url)
    marker = tmp_path / "unpickled"
    # A pickle that would create a file if anyone unpickled it.
    payload = (b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR.")
    _publish(redis_url, payload, "application/x-python-serialize", _headers("pickle-1"))
    result = client.wait("pickle-1", timeout=30)
    assert result.error is not None
    assert result.error.error_type == SkillErrorType.VALIDATION_ERROR
    assert not marker.exists()


def test_an_oversized_message_is_refused_with_a_clear_error(
    redis_url: str, start_worker: StartWorker, client: SkillClient
) -> None:
    worker = start_worker(redis_url)
    big = json.dumps([[{"skill": "local/text-tools", "tool": "local/word-count",
                        "arguments": {"text": "x" * (MAX_MESSAGE_BYTES + 10)}}], {}, {}])
    _publish(redis_url, big.encode(), "application/json", _headers("huge-1"))
    result = client.wait("huge-1", timeout=60)
    assert result.error is not None
    assert result.error.error_type == SkillErrorType.VALIDATION_ERROR
    assert "limit" in result.error.message
    assert worker.alive()


def test_oversized_arguments_are_refused_by_the_client_and_the_worker(
    redis_url: str, start_worker: StartWorker, client: SkillClient
) -> None:
    start_worker(redis_url)
    with pytest.raises(ValueError, match="limit"):
        client.submit("local/text-tools", "local/word-count", {"text": "x" * 1_100_000})
    raw = json.dumps([[{"skill": "local/text-tools", "tool": "local/word-count",
                        "arguments": {"text": "x" * 1_100_000}}], {}, {}])
    _publish(redis_url, raw.encode(), "application/json", _headers("big-args-1"))
    result = client.wait("big-args-1", timeout=60)
    assert result.error is not None
    assert result.error.error_type == SkillErrorType.VALIDATION_ERROR


def test_redis_with_a_password_works_from_the_url(start_worker: StartWorker) -> None:
    server = RedisServer(password="s3cret-pass", persistence=False).start()
    try:
        # Without the password the server refuses.
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=server.port).ping()
        worker = start_worker(server.url)
        settings = Settings.from_env({"CLEVERAGENTS_BROKER_URL": server.url})
        with SkillClient(settings=settings) as producer:
            result = producer.submit("local/text-tools", "local/word-count",
                                     {"text": "a b"}).result(timeout=60)
        assert result.output_data == {"words": 2}
        assert "s3cret-pass" not in worker.log_text()
    finally:
        server.stop()


def test_secrets_stay_out_of_logs_and_stored_payloads(
    redis_url: str, start_worker: StartWorker, client: SkillClient
) -> None:
    # Given a secret in the worker's environment and in the arguments of every invocation
    worker = start_worker(redis_url, SECRET_TOKEN=SECRET)
    handles = [
        client.submit("local/text-tools", "local/word-count", {"text": f"a {SECRET}"}),
        client.submit("local/text-tools", "local/word-count", {"text": [SECRET]}),
        client.submit("local/text-tools", "local/word-count", {"text": SECRET, "x": 1,
                                                               "token": SECRET}),
        client.submit("test/basic", "test/echo", {"text": 5, "token": SECRET}),
        client.submit("local/inspect", "local/line-stats", {"text": SECRET}),
        client.submit("local/notes", "local/write-note", {"name": "n", "text": SECRET}),
        client.submit("ops/none", "x/y", {"token": SECRET}),
    ]
    results = [h.result(timeout=60) for h in handles]
    assert results[0].output_data == {"words": 2}  # the tool saw the whole argument
    assert results[4].output_data == {"lines": 1, "chars": len(SECRET)}
    # When every log line and every stored value is searched
    stored = redis.Redis.from_url(redis_url)
    for key in stored.scan_iter(count=1000):
        kind = stored.type(key)
        values = (
            [stored.get(key)] if kind == b"string"
            else stored.lrange(key, 0, -1) if kind == b"list"
            else list(stored.hgetall(key).values()) if kind == b"hash"
            else []
        )
        for value in values:
            assert SECRET.encode() not in (value or b""), key
    # Then the secret is nowhere
    assert SECRET not in worker.log_text()
