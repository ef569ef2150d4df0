"""A request id is bound to its content: reusing it for another request runs nothing.

The policy on the in-memory stores first (``Pipeline.answered``, the chunk path),
then through a real worker on a real Redis: a raw message reusing a finished id,
the client's own refusal, and a batch line reusing an id.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis as redis_lib
from celery import Celery

from cleveragents.client import SkillClient
from cleveragents.constants import QUEUE_BATCH, QUEUE_READ, TASK_INVOKE, TASK_INVOKE_CHUNK
from cleveragents.pipeline import Pipeline, execute_chunk
from cleveragents.pipeline.binding import REASON_REUSED, content_digest
from cleveragents.pipeline.guard import Guard
from cleveragents.runtime.gating import GATE_REQUEST
from cleveragents.runtime.outcomes import failed_result
from cleveragents.skills import Catalogue, SkillErrorType, SkillResult
from cleveragents.stores import MemoryGuardStore, MemoryResultStore
from tests.support.procs import EXAMPLE_SKILLS, FIXTURE_SKILLS, Worker, wait_until

pytestmark = pytest.mark.timeout(180)

StartWorker = Callable[..., Worker]
TEXT = "local/text-tools"


def _count(rid: str, text: str) -> dict[str, Any]:
    return {"request_id": rid, "skill": TEXT, "tool": "local/word-count",
            "arguments": {"text": text}}


def _write(rid: str, path: Path, *, allow_writes: bool = True) -> dict[str, Any]:
    return {"request_id": rid, "skill": "test/basic", "tool": "test/count-write",
            "arguments": {"path": str(path)}, "allow_writes": allow_writes}


def _reason(result: SkillResult | None) -> Any:
    if result is None or result.error is None:
        return None
    return result.error.details.get("reason")


@pytest.fixture(scope="module")
def catalogue() -> Catalogue:
    return Catalogue.from_paths(FIXTURE_SKILLS, EXAMPLE_SKILLS)


@pytest.fixture
def pipeline(catalogue: Catalogue) -> Pipeline:
    return Pipeline(catalogue, Guard(MemoryGuardStore()), MemoryResultStore())


# --- the policy --------------------------------------------------------------------------


def test_the_digest_is_of_skill_tool_and_arguments_only() -> None:
    first = _count("a", "x y")
    assert content_digest(first) == content_digest({**first, "request_id": "b"})
    assert content_digest(first) == content_digest({**first, "allow_writes": True})
    assert content_digest(first) != content_digest(_count("a", "x y z"))
    flipped = {"tool": "t", "skill": "s"}
    assert content_digest(flipped) == content_digest({"skill": "s", "tool": "t"})
    # Key order is not content
    flipped = {"tool": "t", "skill": "s"}
    assert content_digest(flipped) == content_digest({"skill": "s", "tool": "t"})


def test_a_first_delivery_is_run_and_the_same_content_again_is_answered_by_its_result(
    pipeline: Pipeline,
) -> None:
    assert pipeline.answered(_count("r-1", "a b"), "r-1") is None
    # Not finished yet: the same request again runs (as a redelivery does)
    assert pipeline.answered(_count("r-1", "a b"), "r-1") is None
    result = pipeline.run(_count("r-1", "a b"))
    pipeline.results.put_many([("r-1", result)])
    # Finished: the same request is answered by the stored result, and runs nothing
    answer = pipeline.answered(_count("r-1", "a b"), "r-1")
    assert answer is not None
    assert answer.output_data == {"words": 2}


def test_the_same_id_with_other_content_is_refused_whether_or_not_it_finished(
    pipeline: Pipeline,
) -> None:
    assert pipeline.answered(_count("r-2", "a b"), "r-2") is None
    # Still running: another request under its id is refused all the same
    refused = pipeline.answered({**_count("r-2", "a b"), "tool": "local/upper"}, "r-2")
    assert refused is not None
    assert refused.error is not None
    assert refused.error.error_type == SkillErrorType.VALIDATION_ERROR
    assert _reason(refused) == REASON_REUSED
    assert (refused.skill_name, refused.tool_name) == (TEXT, "local/upper")
    pipeline.results.put_many([("r-2", pipeline.run(_count("r-2", "a b")))])
    assert _reason(pipeline.answered(_count("r-2", "other words"), "r-2")) == REASON_REUSED


def test_a_write_refused_by_its_request_runs_again_when_sent_with_writes(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    target = tmp_path / "w.txt"
    first = _write("w-1", target, allow_writes=False)
    assert pipeline.answered(first, "w-1") is None
    refused = pipeline.run(first)
    assert refused.error is not None
    assert refused.error.error_type == "permission_denied"
    pipeline.results.put_many([("w-1", refused)])
    # The documented re-run with --allow-writes is the same request: it runs
    assert pipeline.answered(_write("w-1", target), "w-1") is None
    # Without writes it is answered by the refusal, as before
    assert pipeline.answered(first, "w-1") is not None


def test_a_chunk_runs_nothing_and_stores_nothing_under_an_id_bound_elsewhere(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    # Given a finished read under "c-1"
    pipeline.results.put_many([("c-1", pipeline.run(_count("c-1", "a b")))])
    pipeline.guard.store.bind([("c-1", content_digest(_count("c-1", "a b")))])
    # When a chunk reuses "c-1" for a write, beside a new request
    target = tmp_path / "w.txt"
    report = execute_chunk(
        pipeline, [_write("c-1", target), _count("c-2", "x")],
        chunk_id="chunk", redelivered=False, requeue=lambda rest, start, rest_id: None,
    )
    # Then the write never ran, "c-1" keeps its result, and the new one ran
    assert not target.exists()
    assert (report.ran, report.skipped) == (1, 1)
    [kept, new] = pipeline.results.get_payloads(["c-1", "c-2"])
    assert kept is not None
    assert kept["output_data"] == {"words": 2}
    assert new is not None
    assert new["output_data"] == {"words": 1}


# --- through a worker ----------------------------------------------------------------------


def _raw_app(url: str) -> Celery:
    app = Celery("attacker", broker=url, backend=url, set_as_current=False)
    app.conf.task_serializer = "json"
    return app


def _settled(worker: Worker, text: str, count: int = 1) -> Callable[[], bool]:
    return lambda: worker.log_text().count(text) >= count


def test_a_raw_message_reusing_a_finished_id_for_a_write_runs_nothing_and_overwrites_nothing(
    redis_url: str, start_worker: StartWorker, client: SkillClient, tmp_path: Path
) -> None:
    worker = start_worker(redis_url)
    # Given a finished read under a request id
    rid = f"reuse-{uuid.uuid4()}"
    first = client.submit(TEXT, "local/word-count", {"text": "a b"}, request_id=rid)
    assert first.result(timeout=60).output_data == {"words": 2}
    # When an attacker sends a write under the same id, straight to the broker
    target = tmp_path / "w.txt"
    with _raw_app(redis_url) as attacker:
        body = _write(rid, target)
        del body["request_id"]
        attacker.send_task(TASK_INVOKE, args=[body], task_id=rid, queue="skills.write")
        # and a different read under it, on the read queue
        other = _count(rid, "one two three")
        del other["request_id"]
        attacker.send_task(TASK_INVOKE, args=[other], task_id=rid, queue=QUEUE_READ)
    # Then the worker refuses both (it says so in its log), runs neither, and the stored
    # result is still the first request's
    wait_until(_settled(worker, REASON_REUSED, 2), 60, "the worker to refuse both messages")
    assert not target.exists()
    stored = client.get(rid)
    assert stored is not None
    assert stored.output_data == {"words": 2}
    assert client.state(rid) == "SUCCESS"


def test_the_same_request_sent_twice_runs_once_and_keeps_its_result(
    redis_url: str, start_worker: StartWorker, client: SkillClient, tmp_path: Path
) -> None:
    worker = start_worker(redis_url)
    target = tmp_path / "w.txt"
    rid = f"twice-{uuid.uuid4()}"
    body = _write(rid, target)
    first = client.submit(body["skill"], body["tool"], body["arguments"], allow_writes=True,
                          request_id=rid)
    assert first.result(timeout=60).success
    written = target.read_text()
    # When the very same message is sent again, behind the client's back
    with _raw_app(redis_url) as producer:
        again = dict(body)
        del again["request_id"]
        producer.send_task(TASK_INVOKE, args=[again], task_id=rid, queue="skills.write")
    # (handled: off its queue and acknowledged)
    server = redis_lib.Redis.from_url(redis_url)
    wait_until(lambda: server.llen("skills.write") == 0 and server.hlen("unacked") == 0, 60,
               "the worker to take and acknowledge the message")
    server.close()
    # Then the write did not run again, and the stored result is the first run's
    assert target.read_text() == written
    stored = client.get(rid)
    assert stored is not None
    assert stored.success
    assert REASON_REUSED not in worker.log_text()  # the same request is not a reuse


def test_a_refused_write_sent_again_with_writes_is_answered_by_its_rerun_not_a_late_message(
    redis_url: str, start_worker: StartWorker, client: SkillClient, tmp_path: Path
) -> None:
    start_worker(redis_url)
    target = tmp_path / "rerun.txt"
    rid = f"rerun-{uuid.uuid4()}"
    body = _write(rid, target, allow_writes=False)
    # Given a write refused for want of allow_writes, whose result the client read
    refused = client.submit(body["skill"], body["tool"], body["arguments"], request_id=rid)
    first = refused.result(timeout=60)
    assert first.error is not None
    assert first.error.error_type == SkillErrorType.PERMISSION_DENIED
    # And the refusal's notification reaching the client only after it read the result
    # (a busy machine: Celery keeps such a message for the next wait on that id)
    backend: Any = client.app.backend
    backend._pending_messages.put(rid, backend.get_task_meta(rid))
    # When it is sent again with allow_writes
    rerun = client.submit(
        body["skill"], body["tool"], body["arguments"], request_id=rid, allow_writes=True
    )
    # Then the answer is the re-run's, not the old refusal
    result = rerun.result(timeout=60)
    assert result.success, result.error
    assert target.exists()


def test_a_write_sent_again_with_writes_waits_past_the_stored_refusal_until_its_rerun(
    redis_url: str, start_worker: StartWorker, client: SkillClient, tmp_path: Path
) -> None:
    target = tmp_path / "late.txt"
    rid = f"late-{uuid.uuid4()}"
    body = _write(rid, target, allow_writes=False)
    # Given a refusal for want of writes stored under the id (no worker runs yet)
    refusal = failed_result(body["skill"], body["tool"], SkillErrorType.PERMISSION_DENIED,
                            "writes not allowed", {"gates": [GATE_REQUEST]})
    client.results.put_many([(rid, refusal)])
    client.bound_elsewhere([client.build_request(body["skill"], body["tool"],
                                                 body["arguments"], request_id=rid)])
    # When it is sent again with writes allowed, the refusal is not its answer
    rerun = client.submit(
        body["skill"], body["tool"], body["arguments"], request_id=rid, allow_writes=True
    )
    with pytest.raises(TimeoutError):
        rerun.result(timeout=1.5)
    assert not rerun.ready()
    # Then the worker runs it, replaces the refusal, and that is the answer
    start_worker(redis_url)
    result = rerun.result(timeout=60)
    assert result.success, result.error
    assert target.exists()


def test_the_client_refuses_an_id_bound_to_another_request_without_sending_it(
    redis_url: str, client: SkillClient
) -> None:
    rid = f"client-{uuid.uuid4()}"
    # Given an id bound to one request (no worker: nothing runs)
    client.submit(TEXT, "local/word-count", {"text": "a b"}, request_id=rid)
    server = redis_lib.Redis.from_url(redis_url)
    queued = server.llen(QUEUE_READ)
    # When the client is asked to send another request under it
    handle = client.submit(TEXT, "local/upper", {"text": "a b"}, request_id=rid)
    # Then the answer is there at once, and nothing was sent
    result = handle.result(timeout=0)
    assert result.error is not None
    assert result.error.error_type == SkillErrorType.VALIDATION_ERROR
    assert _reason(result) == REASON_REUSED
    assert handle.ready()
    assert server.llen(QUEUE_READ) == queued
    # And the same request again is sent as before (it is the same request)
    client.submit(TEXT, "local/word-count", {"text": "a b"}, request_id=rid)
    assert server.llen(QUEUE_READ) == queued + 1
    server.close()


def test_a_batch_line_reusing_an_id_gets_the_refusal_and_the_others_run(
    redis_url: str, start_worker: StartWorker, client: SkillClient
) -> None:
    start_worker(redis_url)
    rid = f"batch-{uuid.uuid4()}"
    assert client.submit(TEXT, "local/word-count", {"text": "a b"}, request_id=rid).result(60)
    lines = [
        {"request_id": rid, "skill": TEXT, "tool": "local/word-count", "arguments": {"text": "q"}},
        {"request_id": f"{rid}-2", "skill": TEXT, "tool": "local/word-count",
         "arguments": {"text": "x y z"}},
    ]
    results = list(client.batches.run_many(lines))
    assert _reason(results[0]) == REASON_REUSED
    assert results[1].output_data == {"words": 3}
    stored = client.get(rid)
    assert stored is not None
    assert stored.output_data == {"words": 2}
    # Sent again as a whole, the batch gives the same answers (the second line is reused)
    again = list(client.batches.run_many(lines))
    assert [_reason(r) for r in again] == [REASON_REUSED, None]
    assert json.dumps(again[1].output_data) == json.dumps({"words": 3})


def test_a_raw_chunk_reusing_an_id_overwrites_nothing(
    redis_url: str, start_worker: StartWorker, client: SkillClient
) -> None:
    worker = start_worker(redis_url)
    rid = f"chunk-{uuid.uuid4()}"
    assert client.submit(TEXT, "local/word-count", {"text": "a b"}, request_id=rid).result(60)
    with _raw_app(redis_url) as attacker:
        attacker.send_task(TASK_INVOKE_CHUNK, args=[[_count(rid, "forged forged forged")]],
                           queue=QUEUE_BATCH)
    wait_until(_settled(worker, REASON_REUSED), 60, "the worker to refuse the chunk item")
    stored = client.get(rid)
    assert stored is not None
    assert stored.output_data == {"words": 2}


@pytest.mark.parametrize("again", ["the same request", "another request"])
def test_a_failed_result_is_kept_when_its_id_is_sent_again(
    redis_url: str, start_worker: StartWorker, client: SkillClient, again: str
) -> None:
    worker = start_worker(redis_url)
    rid = f"failed-{uuid.uuid4()}"
    # Given an invocation that failed (its arguments break the tool's schema)
    failing = _count(rid, "")
    failing["arguments"] = {"text": 42}
    first = client.submit(failing["skill"], failing["tool"], failing["arguments"], request_id=rid)
    result = first.result(timeout=60)
    assert result.error is not None
    assert result.error.error_type == SkillErrorType.VALIDATION_ERROR
    # When its id comes again in a raw message: the same request, or another one
    body = dict(failing) if again == "the same request" else _count(rid, "other words")
    del body["request_id"]
    with _raw_app(redis_url) as producer:
        producer.send_task(TASK_INVOKE, args=[body], task_id=rid, queue=QUEUE_READ)
    server = redis_lib.Redis.from_url(redis_url)
    wait_until(lambda: server.llen(QUEUE_READ) == 0 and server.hlen("unacked") == 0, 60,
               "the worker to take and acknowledge the message")
    server.close()
    # Then the stored result is still the failure (not a STARTED that never ends), and
    # waiting on the id answers with it
    assert client.state(rid) == "FAILURE"
    stored = client.get(rid)
    assert stored is not None
    assert stored.error is not None
    assert stored.error.error_type == SkillErrorType.VALIDATION_ERROR
    if again == "another request":
        assert REASON_REUSED in worker.log_text()


def test_a_body_nested_past_any_encoders_stack_still_has_a_digest() -> None:
    # A raw producer's body decodes (kombu) yet is too deep to encode again on the
    # worker's deeper stack: the id check must still answer, not raise.
    deep: Any = 1
    for _ in range(5000):
        deep = [deep]
    body = {"skill": "s/k", "tool": "t/l", "arguments": {"a": deep}}
    assert content_digest(body) == content_digest(dict(body))
    assert content_digest(body) != content_digest({**body, "arguments": {}})
