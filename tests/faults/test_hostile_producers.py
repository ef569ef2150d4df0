"""Hostile producers: whoever can reach the broker cannot forge, multiply, exhaust or retarget.

Each test sends what an attacker with broker access would send (raw kombu, or
``send_task`` on a Celery app) to a real worker on a real Redis, and checks the
promise: nothing forged, no write multiplied, bounded memory, no secret in the log.
"""

from __future__ import annotations

import json
import time
import uuid
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kombu
import pytest
import redis
from celery import Celery

from cleveragents.client import SkillClient
from cleveragents.constants import QUEUE_BATCH, QUEUE_READ, TASK_INVOKE, TASK_INVOKE_CHUNK
from cleveragents.skills import SkillErrorType
from tests.support.procs import Worker, wait_until

pytestmark = pytest.mark.timeout(240)

StartWorker = Callable[..., Worker]
SECRET = "sk-live-hostile-producer-58b1"


def _publish(url: str, body: bytes, headers: dict[str, Any], **properties: Any) -> None:
    exchange = kombu.Exchange(QUEUE_READ, type="direct")
    with kombu.Connection(url) as conn:
        conn.Producer().publish(
            body, exchange=exchange, routing_key=QUEUE_READ, headers=headers,
            content_type="application/json", content_encoding="utf-8",
            declare=[kombu.Queue(QUEUE_READ, exchange, routing_key=QUEUE_READ)], **properties,
        )


def _task_headers(task_id: str, task: str = TASK_INVOKE, **extra: Any) -> dict[str, Any]:
    return {"lang": "py", "task": task, "id": task_id, "root_id": task_id, "parent_id": None,
            "group": None, **extra}


def _zlib_bomb(expanded_mb: int) -> bytes:
    # A JSON body of zeros in a string, compressed a megabyte at a time (never held whole).
    packer = zlib.compressobj(9)
    parts = [packer.compress(b'[[{"skill": "local/text-tools", "tool": "local/word-count", '
                             b'"arguments": {"text": "')]
    chunk = b"0" * (1 << 20)
    parts += [packer.compress(chunk) for _ in range(expanded_mb)]
    parts.append(packer.compress(b'"}}], {}, {}]'))
    parts.append(packer.flush())
    return b"".join(parts)


def _peak_rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def _raw_app(url: str) -> Celery:
    app = Celery("attacker", broker=url, backend=url, set_as_current=False)
    app.conf.task_serializer = "json"
    return app


def _failed_with(client: SkillClient, request_id: str, kind: SkillErrorType) -> str:
    result = client.wait(request_id, timeout=60)
    assert result.error is not None, result
    assert result.error.error_type == kind, result.error
    return result.error.message


def test_a_compression_bomb_is_refused_before_it_is_expanded(
    redis_url: str, start_worker: StartWorker, client: SkillClient
) -> None:
    # Given a worker, and a zlib body that expands 1000:1 (400 MB from about 400 KB)
    worker = start_worker(redis_url)
    assert worker.proc is not None
    bomb = _zlib_bomb(400)
    assert len(bomb) * 1000 < 400 << 20
    client.submit("local/text-tools", "local/word-count", {"text": "warm up"}).result(timeout=60)
    before = _peak_rss_kb(worker.proc.pid)

    # When it is sent with a compression header
    task_id = f"bomb-{uuid.uuid4()}"
    _publish(redis_url, bomb, _task_headers(task_id, compression="application/x-gzip"))

    # Then it is refused under its id, and the worker's memory grew by less than 64 MB
    assert "compressed" in _failed_with(client, task_id, SkillErrorType.VALIDATION_ERROR)
    assert _peak_rss_kb(worker.proc.pid) - before < 64 * 1024
    assert client.submit("local/text-tools", "local/word-count", {"text": "a b"}).result(
        timeout=60
    ).output_data == {"words": 2}


def test_an_oversized_header_is_refused_like_an_oversized_body(
    redis_url: str, start_worker: StartWorker, client: SkillClient
) -> None:
    start_worker(redis_url)
    task_id = f"big-header-{uuid.uuid4()}"
    body = json.dumps([[{"skill": "local/text-tools", "tool": "local/word-count",
                         "arguments": {"text": "a"}}], {}, {}]).encode()
    _publish(redis_url, body, _task_headers(task_id, padding="x" * 20_000_000))

    assert "limit" in _failed_with(client, task_id, SkillErrorType.VALIDATION_ERROR)


def test_celerys_builtin_tasks_cannot_forge_a_result(
    redis_url: str, start_worker: StartWorker, client: SkillClient
) -> None:
    # Given a finished invocation
    start_worker(redis_url)
    victim = client.submit("local/text-tools", "local/word-count", {"text": "a b c"})
    assert victim.result(timeout=60).output_data == {"words": 3}
    attacker = _raw_app(redis_url)
    forged = {"skill_name": "local/text-tools", "tool_name": "local/word-count",
              "success": True, "output_data": {"words": 999}}

    # When celery.accumulate is sent with the victim's id, and with a fresh id
    attacker.send_task("celery.accumulate", args=[forged], task_id=victim.request_id,
                       queue=QUEUE_READ)
    fresh = f"forged-{uuid.uuid4()}"
    attacker.send_task("celery.accumulate", args=[forged], kwargs={"index": 0}, task_id=fresh,
                       queue=QUEUE_READ)

    # Then the fresh id gets a validation_error, and the victim's result is untouched
    assert "not accepted" in _failed_with(client, fresh, SkillErrorType.VALIDATION_ERROR)
    stored = client.get(victim.request_id)
    assert stored is not None
    assert stored.output_data == {"words": 3}


def test_starmap_cannot_multiply_one_write(
    redis_url: str, start_worker: StartWorker, client: SkillClient, tmp_path: Path
) -> None:
    # Given a write request, wrapped in celery.starmap three times over
    start_worker(redis_url)
    target = tmp_path / "writes.txt"
    body = {"skill": "test/basic", "tool": "test/count-write",
            "arguments": {"path": str(target)}, "allow_writes": True}
    signature: dict[str, Any] = {"task": TASK_INVOKE, "args": [], "kwargs": {}, "options": {},
                 "subtask_type": None, "immutable": False}
    task_id = f"starmap-{uuid.uuid4()}"
    _raw_app(redis_url).send_task("celery.starmap", kwargs={"task": signature,
                                                            "it": [[body]] * 3},
                                  task_id=task_id, queue=QUEUE_READ)

    # Then it is refused, and the write never ran
    _failed_with(client, task_id, SkillErrorType.VALIDATION_ERROR)
    assert not target.exists()


def test_an_unknown_task_name_is_answered_and_its_arguments_never_logged(
    redis_url: str, start_worker: StartWorker, client: SkillClient
) -> None:
    worker = start_worker(redis_url)
    task_id = f"unknown-{uuid.uuid4()}"
    _raw_app(redis_url).send_task("evil.task", args=[{"token": SECRET}], task_id=task_id,
                                  queue=QUEUE_READ)

    _failed_with(client, task_id, SkillErrorType.VALIDATION_ERROR)
    assert task_id in worker.log_text()
    assert SECRET not in worker.log_text()


def test_a_producers_time_limit_and_eta_are_ignored(
    redis_url: str, start_worker: StartWorker, client: SkillClient
) -> None:
    # Given a tool that sleeps 2 s, sent with a 1 s hard time limit, and one with an ETA
    start_worker(redis_url)
    body = {"skill": "test/hostile", "tool": "test/sleep-with", "arguments": {"seconds": 2}}
    limited, later = f"limited-{uuid.uuid4()}", f"later-{uuid.uuid4()}"
    attacker = _raw_app(redis_url)
    attacker.send_task(TASK_INVOKE, args=[body], task_id=limited, queue=QUEUE_READ,
                       time_limit=1, soft_time_limit=1)
    attacker.send_task(TASK_INVOKE, args=[{**body, "arguments": {"seconds": 0}}], task_id=later,
                       queue=QUEUE_READ, countdown=3600)

    # Then the worker's own limits decide: the first runs to the end, the second runs now
    started = time.monotonic()
    result = client.wait(limited, timeout=60)
    assert result.success, result.error
    assert client.wait(later, timeout=30).success
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("chosen", [False, True], ids=["fresh id", "id chosen and bound first"])
def test_a_running_invocation_reads_as_started(
    redis_url: str, start_worker: StartWorker, client: SkillClient, chosen: bool
) -> None:
    # STARTED is stored with the id's bind: for a fresh id the bind is the worker's
    # first, for a chosen one the client bound it before sending
    start_worker(redis_url)
    rid = f"started-{uuid.uuid4()}" if chosen else None
    handle = client.submit("test/hostile", "test/sleep-with", {"seconds": 3, "token": "t"},
                           request_id=rid)
    wait_until(lambda: client.state(handle.request_id) == "STARTED", 30, "the tool to start")
    assert handle.result(timeout=60).success
    assert client.state(handle.request_id) == "SUCCESS"


def test_inspect_shows_redacted_arguments_of_running_invocations(
    redis_url: str, start_worker: StartWorker, client: SkillClient
) -> None:
    # Given an invocation with a secret argument, running for a few seconds
    worker = start_worker(redis_url)
    handle = client.submit("test/hostile", "test/sleep-with", {"seconds": 4, "token": SECRET})
    wait_until(lambda: client.state(handle.request_id) == "STARTED", 30, "the tool to start")

    # When a monitor asks what runs, what is reserved and scheduled, and queries the task
    inspect = client.app.control.inspect(timeout=5, limit=1)
    seen = json.dumps([inspect.active(), inspect.reserved(), inspect.scheduled(),
                       inspect.query_task(handle.request_id)], default=str)

    # Then it sees the invocation, with skill and tool, and never the secret
    assert handle.request_id in seen
    assert "test/sleep-with" in seen
    assert SECRET not in seen
    assert handle.result(timeout=60).success
    assert SECRET not in worker.log_text()


def _queues_of(client: SkillClient) -> set[str]:
    replies = client.app.control.inspect(timeout=5, limit=1).active_queues() or {}
    return {q["name"] for queues in replies.values() for q in queues}


def test_broadcast_shutdown_and_add_consumer_are_refused_by_default(
    redis_url: str, start_worker: StartWorker, client: SkillClient
) -> None:
    # Given a worker with default settings
    worker = start_worker(redis_url)

    # When anyone on the broker broadcasts shutdown and add_consumer (limit=1: each
    # returns at the worker's reply; the time-out only matters on a loaded machine)
    control = client.app.control
    replies = control.broadcast("shutdown", reply=True, timeout=15, limit=1) or []
    replies += control.add_consumer("skills.elsewhere", reply=True, timeout=15, limit=1) or []

    # Then the worker says no to both (a reply comes once the command was handled), still
    # serves an invocation sent after them, keeps running, and consumes what it did
    assert len(replies) == 2
    assert all("disabled" in str(reply) for reply in replies)
    assert client.submit("local/text-tools", "local/word-count", {"text": "x"}).result(
        timeout=60
    ).success
    assert worker.alive()
    assert "skills.elsewhere" not in _queues_of(client)


def test_a_read_only_worker_never_consumes_a_write_queue_even_when_told_to(
    redis_url: str, start_worker: StartWorker, client: SkillClient, tmp_path: Path
) -> None:
    # Given a read-only worker that obeys remote control, with one process
    worker = start_worker(
        redis_url, read_only=True, concurrency=1, CLEVERAGENTS_REMOTE_CONTROL="1"
    )

    # When it is told to consume the write queue, then another queue, and a write is
    # waiting in the write queue (once it answers a ping: on Redis a worker subscribes to
    # broadcasts when its event loop first polls, after it says it is ready, and a
    # broadcast sent before that is lost; each command's reply comes once it was handled)
    control = client.app.control
    wait_until(lambda: control.ping(timeout=1), 30, "the worker to answer a ping")
    assert control.add_consumer("skills.write", reply=True, timeout=15, limit=1)
    assert control.add_consumer("skills.extra", reply=True, timeout=15, limit=1)
    handle = client.submit("test/basic", "test/count-write", {"path": str(tmp_path / "w")},
                           allow_writes=True)
    # ... and then a read in the other queue. A worker fetches from its queues in the
    # order it consumes them, one message at a time here: had it taken the write queue
    # (before the other), the waiting write would have run before this read is answered.
    marker = f"after-the-write-{uuid.uuid4()}"
    body = json.dumps([[{"skill": "local/text-tools", "tool": "local/word-count",
                         "arguments": {"text": "x"}}], {}, {}]).encode()
    _publish_to(redis_url, "skills.extra", body, _task_headers(marker))
    assert client.wait(marker, timeout=60).success

    # Then it took the other queue (remote control is on) but not the write queue, said
    # so, and the write still waits there, never received
    assert "does not consume the write queue 'skills.write'" in worker.log_text()
    queues = _queues_of(client)
    assert "skills.extra" in queues
    assert "skills.write" not in queues
    assert redis.Redis.from_url(redis_url).llen("skills.write") == 1
    assert handle.request_id not in worker.log_text()
    assert client.get(handle.request_id) is None
    assert not (tmp_path / "w").exists()


def test_remote_control_can_be_turned_on(
    redis_url: str, start_worker: StartWorker, client: SkillClient
) -> None:
    worker = start_worker(redis_url, CLEVERAGENTS_REMOTE_CONTROL="1")
    client.app.control.broadcast("shutdown")
    wait_until(lambda: not worker.alive(), 30, "the worker to stop")


def test_a_requests_timeout_never_goes_past_the_workers_maximum(
    redis_url: str, start_worker: StartWorker, client: SkillClient
) -> None:
    # Given a worker whose maximum is 1 s, and a request asking for a billion seconds
    start_worker(redis_url, CLEVERAGENTS_MAX_TIMEOUT_S="1")
    started = time.monotonic()
    handle = client.submit("test/hostile", "test/sleep-with", {"seconds": 20}, timeout_s=1e9)

    # Then the tool is stopped at the worker's maximum
    result = handle.result(timeout=60)
    assert result.error is not None
    assert result.error.details.get("reason") == "timeout"
    assert result.error.details.get("timeout_s") == 1
    assert time.monotonic() - started < 15


def test_a_raw_message_cannot_link_another_invocation(
    redis_url: str, start_worker: StartWorker, client: SkillClient, tmp_path: Path
) -> None:
    # Given a read request whose options link a write invocation as its callback, and a
    # worker with one process
    worker = start_worker(redis_url, concurrency=1)
    target = tmp_path / "linked-write.txt"
    linked = f"linked-{uuid.uuid4()}"
    callback = {
        "task": TASK_INVOKE,
        "args": [{"skill": "test/basic", "tool": "test/count-write",
                  "arguments": {"path": str(target)}, "allow_writes": True}],
        "kwargs": {}, "options": {"task_id": linked, "queue": "skills.write"},
        "subtask_type": None, "immutable": True,
    }
    task_id = f"linking-{uuid.uuid4()}"
    body = json.dumps([
        [{"skill": "local/text-tools", "tool": "local/word-count", "arguments": {"text": "x"}}],
        {}, {"callbacks": [callback], "errbacks": [callback], "chain": None, "chord": None},
    ]).encode()
    _publish(redis_url, body, _task_headers(task_id))

    # Then the request runs, and nothing linked to it is ever sent: Celery sends a callback
    # before it stores the result, so a linked write would be queued before a write sent
    # now, and run first by the worker's one process (a read would go first anyway)
    assert client.wait(task_id, timeout=60).success
    after = client.submit("test/basic", "test/count-write",
                          {"path": str(tmp_path / "after.txt")}, allow_writes=True)
    assert after.result(timeout=60).success
    assert linked not in worker.log_text()
    assert client.get(linked) is None
    assert not target.exists()


def test_invented_skill_names_do_not_become_metric_series(
    redis_url: str, start_worker: StartWorker, client: SkillClient
) -> None:
    # Given invocations of 30 skills a producer made up, and one real one
    from tests.support.prom import scrape as _metrics

    start_worker(redis_url)
    made_up = [
        client.submit(f"x/invented-{i}-{'y' * 300}", "x/tool", {}) for i in range(30)
    ]
    real = client.submit("local/text-tools", "local/word-count", {"text": "a"})
    for handle in [*made_up, real]:
        handle.result(timeout=60)

    # Then the made-up names are counted as one "unknown" series, the real one by name
    def counted() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {
            key: value for key, value in _metrics(redis_url).items()
            if key[0] == "cleveragents_invocations_total" and value > 0  # not those at zero
        }

    wait_until(lambda: sum(counted().values()) >= 31, 30, "the counters to be flushed")
    skills = {dict(labels)["skill"] for _, labels in counted()}
    assert skills == {"unknown", "local/text-tools"}


def _publish_to(url: str, queue: str, body: bytes, headers: dict[str, Any]) -> None:
    exchange = kombu.Exchange(queue, type="direct")
    with kombu.Connection(url) as conn:
        conn.Producer().publish(
            body, exchange=exchange, routing_key=queue, headers=headers,
            content_type="application/json", content_encoding="utf-8",
            declare=[kombu.Queue(queue, exchange, routing_key=queue)],
        )


def test_half_a_surrogate_pair_gets_a_validation_error_and_the_worker_serves_on(
    redis_url: str, start_worker: StartWorker, client: SkillClient
) -> None:
    # Given raw messages whose JSON escapes half of a surrogate pair (text no UTF-8
    # log, key or result can hold): in an argument, in an argument's name, in the
    # skill's name, and in two items of a batch chunk
    worker = start_worker(redis_url)
    single = f"half-{uuid.uuid4()}"
    key = f"half-key-{uuid.uuid4()}"
    skill = f"half-skill-{uuid.uuid4()}"
    items = [f"half-item-{i}-{uuid.uuid4()}" for i in range(3)]

    def request(arguments: str, skill: str = "local/text-tools", rid: str = "") -> str:
        # JSON text as a raw producer writes it: the escapes stay as written
        head = f'{{"request_id": "{rid}", ' if rid else "{"
        return head + f'"skill": "{skill}", "tool": "local/word-count", "arguments": {arguments}}}'

    for task_id, text in (
        (single, request('{"text": "a \\ud800 b"}')),
        (key, request('{"\\udfff": 1}')),
        (skill, request("{}", skill="local/\\udc00")),
    ):
        _publish(redis_url, f"[[{text}], {{}}, {{}}]".encode(), _task_headers(task_id))
    # ... and a message, and a chunk's item, whose id holds one (no result can be stored)
    _publish(redis_url, f"[[{request('{}')}], {{}}, {{}}]".encode(), _task_headers("id-\udc00"))
    texts = ['{"text": "x \\udbff"}', '{"text": "fine words"}', '{"text": ["\\ud800"]}']
    chunk = ", ".join(request(t, rid=r) for r, t in zip(items, texts, strict=True))
    chunk += ", " + request('{"text": "no id to answer"}', rid="item-\\ud800")
    _publish_to(redis_url, QUEUE_BATCH, f"[[[{chunk}]], {{}}, {{}}]".encode(),
                _task_headers(f"chunk-{uuid.uuid4()}", TASK_INVOKE_CHUNK))

    # Then each is a validation error naming the surrogate, and the chunk's good item runs
    for task_id in (single, key, skill, items[0], items[2]):
        message = _failed_with(client, task_id, SkillErrorType.VALIDATION_ERROR)
        assert "surrogate" in message
    fine = client.wait(items[1], timeout=60)
    assert fine.success, fine.error
    assert fine.output_data == {"words": 2}
    # And the worker serves on, its log free of encoding errors
    assert client.submit("local/text-tools", "local/word-count", {"text": "a b"}).result(
        timeout=30
    ).success
    assert worker.alive()
    for trouble in ("UnicodeEncodeError", "Logging error", "Traceback"):
        assert trouble not in worker.log_text()
