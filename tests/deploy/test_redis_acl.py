"""Redis users per role: every role of the deployment works with its own user's rights only.

The users are the compose file's (its ``redis-users`` config, filled in the way Compose
does: ``tests/support/composefile.py`` ``RedisWithUsers``), loaded into a private redis-server. A
real worker started with its compose command, a producer (single invocations, a batch, a
background batch through the console script), the metrics exporter and a client doing
what Flower does (events, inspect, results, queue lengths) each log in as their own user.
Redis must refuse none of their commands (``ACL LOG`` stays empty), and must refuse what
a hostile producer, or a curious Flower or exporter, would try. docs/deployment.md shows
the same rules as ``ACL SETUSER`` lines.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery.result import AsyncResult
from kombu.exceptions import OperationalError

from cleveragents.constants import QUEUE_READ, TASK_INVOKE
from cleveragents.messages import result_payload
from cleveragents.metrics.exporter import render
from cleveragents.metrics.recorder import MetricsRecorder
from cleveragents.pipeline.binding import content_digest
from cleveragents.runtime.gating import GATE_REQUEST
from cleveragents.runtime.outcomes import failed_result
from cleveragents.settings import Settings
from cleveragents.skills import SkillErrorType, SkillResult
from cleveragents.skills.policies import Limits
from cleveragents.stores import Claim, RedisGuardStore, StartedMark, open_stores
from cleveragents.stores.quotas import Permit, RedisLimitGate
from tests.support.acl_roles import compose_worker, producer_client, role_app
from tests.support.composefile import (
    REDIS_ADMIN,
    REDIS_PEOPLE,
    REDIS_USERS,
    RedisWithUsers,
    _program,
    _raw_compose,
    _redis_users_config,
    _subprocess_env,
)
from tests.support.procs import REPO, wait_until
from tests.support.prom import Samples, parse, total, value

pytestmark = pytest.mark.timeout(240)

DOCS = REPO / "docs" / "deployment.md"
INVOCATIONS = "cleveragents_invocations_total"


# ---- the rules: one source, loaded by Redis ---------------------------------------------------


def _documented_lines() -> list[str]:
    """The ``ACL SETUSER`` lines of docs/deployment.md's "Redis users per role"."""
    text = DOCS.read_text(encoding="utf-8")
    section = text.split("## Redis users per role", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("ACL SETUSER ")]


def test_docs_show_the_compose_files_redis_users_as_acl_setuser_lines() -> None:
    # The docs write each password as the name of its .env variable.
    expected = [
        re.sub(r">\$\{(\w+):\?[^}]*\}", r">\1", line).replace("user ", "ACL SETUSER ", 1)
        for line in _redis_users_config(_raw_compose()).splitlines()
    ]
    # On a change of the compose file's rules, its ```text block must read:
    assert _documented_lines() == expected, "\n".join(expected)


def test_redis_loads_one_user_per_role_and_lets_nobody_in_without_one(
    acl_redis: RedisWithUsers,
) -> None:
    users = {user for user, _ in REDIS_USERS.values()} | set(REDIS_PEOPLE)
    assert set(acl_redis.admin().acl_users()) == {"default", REDIS_ADMIN[0], *users}
    # No login, or the password alone (the default user), gets nothing.
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=acl_redis.port).ping()
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=acl_redis.port, password=acl_redis.password("worker")).ping()
    # A user's password is its own: not another role's.
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(acl_redis.url("producer").replace("producer:", "worker:")).ping()
    for user in users:
        assert redis.Redis.from_url(acl_redis.url(user)).ping()


# ---- fixtures: a Redis with the compose users, a worker with its compose command -------------


@pytest.fixture(scope="module")
def acl_server() -> Iterator[RedisWithUsers]:
    """One private redis-server with the compose file's users, for the module."""
    server = RedisWithUsers().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def acl_redis(acl_server: RedisWithUsers) -> RedisWithUsers:
    """The module's server, with ACL LOG emptied: a test sees only its own refusals."""
    acl_server.admin().acl_log_reset()
    return acl_server


@pytest.fixture(scope="module")
def acl_worker(
    acl_server: RedisWithUsers, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A worker (the compose worker service, its user) serving the module; its node name."""
    folder = tmp_path_factory.mktemp("acl-worker")
    with compose_worker(acl_server, "worker", folder):
        replies = role_app(acl_server, "flower").control.inspect(timeout=10, limit=1).ping() or {}
        assert len(replies) == 1, replies
        yield next(iter(replies))


def _cli(server: RedisWithUsers, service: str, home: Path, *args: str) -> str:
    """Run the console script as ``service`` would (its URL, so its Redis user)."""
    env = {**_subprocess_env(service, home), "CLEVERAGENTS_BROKER_URL": server.service_url(service)}
    done = subprocess.run(
        [*_program(["cleveragents"]), *args],
        cwd=home,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode in (0, 1), done.stdout + done.stderr
    return done.stdout


# ---- each role, with its own user ------------------------------------------------------------


@pytest.mark.slow
def test_producer_submits_waits_and_runs_batches_as_its_own_user(
    acl_redis: RedisWithUsers, acl_worker: str, tmp_path: Path
) -> None:
    with producer_client(acl_redis, tmp_path) as client:
        # A single invocation, submitted and waited for
        handle = client.submit("local/text-tools", "local/word-count", {"text": "a b c"})
        assert handle.result(timeout=60).output_data == {"words": 3}
        # A small batch, in chunks, results in input order
        requests = [
            {"skill": "local/text-tools", "tool": "local/word-count", "arguments": {"text": t}}
            for t in ("one", "one two", "one two three")
        ]
        counts = [r.output_data for r in client.batches.run_many(requests, chunk_size=2)]
        assert counts == [{"words": 1}, {"words": 2}, {"words": 3}]
        # A write that is not idempotent: the worker claims it (its claim keys)
        write = client.submit(
            "local/notes",
            "local/append-note",
            {"name": "acl", "line": "one line"},
            allow_writes=True,
            request_id=f"acl-append-{uuid.uuid4()}",
        )
        assert write.result(timeout=60).success
        # A write refused for want of allow_writes, then sent again with it: the worker
        # replaces the refusal, which the producer reads past meanwhile
        rid = f"acl-rerun-{uuid.uuid4()}"
        args = {"name": "acl", "text": "x"}
        refused = client.submit("local/notes", "local/write-note", args, request_id=rid)
        error = refused.result(timeout=60).error
        assert error is not None
        assert error.error_type == SkillErrorType.PERMISSION_DENIED
        rerun = client.submit(
            "local/notes", "local/write-note", args, request_id=rid, allow_writes=True
        )
        assert rerun.result(timeout=60).success
    # A background batch through the console script, with a line that is not a request
    # (its validation_error kept in the batch's ledger: the producer may not write a result),
    # its status and its results
    batch = tmp_path / "batch.jsonl"
    batch.write_text(json.dumps(requests[0]) + "\nnot json\n", encoding="utf-8")
    batch_id = _cli(acl_redis, "producer", tmp_path, "batch", "submit", str(batch)).split()[0]
    out = tmp_path / "out.jsonl"
    _cli(acl_redis, "producer", tmp_path, "batch", "results", batch_id, "--out", str(out))
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [line["success"] for line in lines] == [True, False]
    assert lines[1]["error"]["error_type"] == "validation_error"
    status = _cli(acl_redis, "producer", tmp_path, "batch", "status", batch_id)
    assert f"{batch_id}: 2 of 2 done" in status
    # And Redis refused nothing the producer or the worker did
    assert acl_redis.denials() == []


@pytest.mark.slow
def test_metrics_exporter_reads_queues_and_counters_as_its_own_user(
    acl_redis: RedisWithUsers, acl_worker: str, tmp_path: Path
) -> None:
    with producer_client(acl_redis, tmp_path) as client:
        text = "counted by the exporter"
        assert client.submit("local/text-tools", "local/shout", {"text": text}).result(60).success
    # The worker adds its counts to Redis every couple of seconds
    series = {"skill": "local/text-tools", "tool": "local/shout", "outcome": "success"}
    exported: list[Samples] = []

    def counted() -> bool:
        exported[:] = [parse(_cli(acl_redis, "metrics", tmp_path, "metrics", "--once"))]
        return value(exported[0], INVOCATIONS, **series, error_type="", reason="") == 1

    wait_until(counted, 30, "the invocation in the exporter's output", interval=1)
    assert ("cleveragents_queue_length", (("queue", "skills.read"),)) in exported[0]
    assert value(exported[0], "cleveragents_queue_length", queue="skills.read") == 0
    assert acl_redis.denials() == []


@pytest.mark.slow
def test_flower_like_client_follows_events_and_inspects_workers_as_its_own_user(
    acl_redis: RedisWithUsers, acl_worker: str, tmp_path: Path
) -> None:
    app = role_app(acl_redis, "flower")
    events: list[dict[str, Any]] = []
    with app.connection_for_read() as connection:
        receiver = app.events.Receiver(connection, handlers={"*": events.append})
        capture = threading.Thread(target=lambda: receiver.capture(limit=None), daemon=True)
        capture.start()
        try:
            wait_until(
                lambda: any(e["type"] == "worker-heartbeat" for e in events),
                30,
                "a worker heartbeat",
            )
            with producer_client(acl_redis, tmp_path) as client:
                handle = client.submit("local/text-tools", "local/word-count", {"text": "x"})
                assert handle.result(timeout=60).success

            def seen(kind: str) -> bool:
                return any(e["type"] == kind and e.get("uuid") == handle.request_id for e in events)

            # The producer's task-sent, the worker's received, started and succeeded
            for kind in ("task-sent", "task-received", "task-started", "task-succeeded"):
                wait_until(lambda kind=kind: seen(kind), 30, kind)  # type: ignore[misc]
        finally:
            receiver.should_stop = True
            capture.join(10)
    # Inspect, as Flower's worker pages do
    inspect = app.control.inspect(timeout=10, destination=[acl_worker])
    assert inspect.ping() == {acl_worker: {"ok": "pong"}}
    assert acl_worker in (inspect.stats() or {})
    assert acl_worker in (inspect.active() or {})
    queues = {q["name"] for q in (inspect.active_queues() or {})[acl_worker]}
    assert queues >= {"skills.read", "skills.write"}
    # The task's result (Flower's task API), and the queue lengths (its Broker page)
    assert AsyncResult(handle.request_id, app=app).state == "SUCCESS"
    waited: dict[str, Any] = AsyncResult(handle.request_id, app=app).get(
        timeout=10, propagate=False
    )
    assert waited["success"] is True
    flower = redis.Redis.from_url(acl_redis.service_url("flower"))
    with flower.pipeline() as pipe:  # as Flower reads them: one MULTI/EXEC
        pipe.llen("skills.read")
        pipe.llen("skills.write")
        lengths = pipe.execute()
    assert lengths == [0, 0]
    app.close()
    assert acl_redis.denials() == []


def test_flower_cannot_enqueue_a_task(acl_redis: RedisWithUsers) -> None:
    # What Flower's task API (apply, async-apply, send-task) would do: refused, at once.
    app = role_app(acl_redis, "flower")
    with pytest.raises(OperationalError, match="no permissions"):
        app.send_task("skills.invoke", args=[{}], queue="skills.read")
    app.close()
    assert acl_redis.admin().llen("skills.read") == 0
    assert {entry["username"] for entry in acl_redis.denials()} == {"flower"}


# ---- every Redis path of the library, as the role that takes it ---------------------------------


def test_worker_user_may_take_every_redis_path_of_the_workers_code(
    acl_redis: RedisWithUsers,
) -> None:
    # Paths a short test run seldom takes: poison messages, waiting on a claim, failures.
    app = role_app(acl_redis, "worker")
    stores = open_stores(Settings.from_env({}), app.backend)  # as worker/state.py opens them
    rid = f"acl-paths-{uuid.uuid4()}"
    result = SkillResult(skill_name="s", tool_name="t", success=True, output_data={"n": 1})
    guard = stores.guard
    assert guard.attempt(rid) == 1
    assert guard.claim(rid, Claim.mine(10)) is None
    # a second delivery finds the first one's claim
    assert guard.claim(rid, Claim.mine(10)) is not None
    guard.finish(rid, result_payload(result, rid))
    assert (guard.read_claim(rid) or Claim("", 0, 0.0)).done == result_payload(result, rid)
    guard.dead_letter(rid, {"skill": "s", "tool": "t", "attempts": 3})
    store = stores.results
    store.put_many([(rid, result)])
    assert store.get_payloads([rid]) == [result_payload(result, rid)]
    app.backend.mark_as_failure(f"{rid}-failed", ValueError("refused"))
    recorder = MetricsRecorder(stores.metrics)
    recorder.record(result)
    recorder.record_wait("s", "t", 0.25)
    recorder.flush()
    # A tool's fleet-wide limits: a slot and a start taken, renewed, given back
    gate = RedisLimitGate(app.backend.client, recovery_s=2)  # type: ignore[attr-defined]
    permit = gate.take("s|t", Limits(concurrency=1, rate="5/s"))
    assert isinstance(permit, Permit)
    assert isinstance(gate.take("s|t", Limits(concurrency=1)), float)
    # A renewal under the worker's user moves the slot's lease on (a denied one would not)
    running = f"{gate.prefix}s|t:running"
    leased = acl_redis.admin().zscore(running, permit.token)
    assert leased is not None
    wait_until(
        lambda: (acl_redis.admin().zscore(running, permit.token) or 0) > leased, 10, "a renewal"
    )
    permit.release()
    app.close()
    # The exporter reads what the worker counted
    exported = parse(render(redis.Redis.from_url(acl_redis.service_url("metrics"))))
    assert total(exported, "cleveragents_invocations_total", skill="s", tool="t", outcome="success")
    assert acl_redis.denials() == []


def test_producer_user_may_take_every_redis_path_of_the_producers_code(
    acl_redis: RedisWithUsers, tmp_path: Path
) -> None:
    with producer_client(acl_redis, tmp_path) as client:
        rid = f"acl-paths-{uuid.uuid4()}"
        refused = failed_result(
            "s", "t", SkillErrorType.PERMISSION_DENIED, "no", {"gates": [GATE_REQUEST]}
        )
        # Stored by a worker (the producer may not write a result)
        worker_side = open_stores(
            Settings.from_env({"CLEVERAGENTS_BROKER_URL": acl_redis.url("worker")}),
            role_app(acl_redis, "worker").backend,
            worker=True,
        )
        worker_side.results.put_many([(rid, refused)])
        assert client.get(rid) is not None
        assert client.state(rid) == "FAILURE"
        # Sent again with writes allowed: the stored refusal is not reused (nor deleted:
        # the worker replaces it)
        assert client.results.reusable([rid], [True]) == [None]
        assert client.get(rid) is not None
        client.ledger.set_meta("acl-batch", {"total": 2})
        client.ledger.append("acl-batch", [rid, "other"])
        assert list(client.ledger.ids("acl-batch")) == [rid, "other"]
        assert client.ledger.meta("acl-batch") == {"total": 2}
        # A background batch's invalid line keeps its result in the ledger
        client.ledger.refuse("acl-batch", [("other", result_payload(refused, "other"))])
        assert client.ledger.refusals("acl-batch", [rid, "other"]) == [
            None,
            result_payload(refused, "other"),
        ]
    assert acl_redis.denials() == []


# ---- what each user is refused -----------------------------------------------------------------

#: What a hostile producer would try: wipe or reconfigure Redis, list or read others' keys
#: (claims, queued and unacknowledged messages), drop a queue, forge a claim, metrics or
#: worker events, steer workers by remote control, run a script.
PRODUCER_REFUSED = [
    ("FLUSHALL",),
    ("FLUSHDB",),
    ("CONFIG", "GET", "*"),
    ("CONFIG", "SET", "appendonly", "no"),
    ("KEYS", "*"),
    ("SCAN", "0"),
    ("GET", "cleveragents:claim:write:someone"),
    ("SET", "cleveragents:claim:write:someone", "forged"),
    ("SET", "celery-task-meta-someone", '{"status": "SUCCESS", "result": "forged"}'),
    ("SET", "cleveragents:bind:someone", "forged"),
    ("DEL", "cleveragents:bind:someone"),
    ("DEL", "celery-task-meta-someone"),
    ("LRANGE", "skills.read", "0", "-1"),
    ("LINDEX", "skills.write", "0"),
    ("RPOP", "skills.write"),
    ("BRPOP", "skills.write", "1"),
    ("DEL", "skills.read"),
    ("HGETALL", "unacked"),
    ("HINCRBY", "cleveragents:metrics:invocations", "forged", "1"),
    ("SREM", "_kombu.binding.skills.read", "x"),
    ("SADD", "_kombu.binding.celery.pidbox", "x"),
    ("PUBLISH", "/0.celery.pidbox", "{}"),
    ("PUBLISH", "/0.celeryev/worker.heartbeat", "{}"),
    ("PUBLISH", "/0.celeryev/task.succeeded", "{}"),
    ("EVAL", "return 1", "0"),
    ("SCRIPT", "LOAD", "return 1"),
    ("ACL", "LIST"),
    ("CLIENT", "LIST"),
]
#: Flower watches: it may not enqueue, read a queued or unacknowledged message, read
#: claims, write results or forge events.
FLOWER_REFUSED = [
    ("LPUSH", "skills.read", "{}"),
    ("LRANGE", "skills.read", "0", "-1"),
    ("LINDEX", "skills.read", "0"),
    ("HGET", "unacked", "tag"),
    ("GET", "cleveragents:claim:write:someone"),
    ("SET", "celery-task-meta-someone", "forged"),
    ("PUBLISH", "/0.celeryev/task.succeeded", "{}"),
    ("KEYS", "*"),
    ("FLUSHALL",),
]
#: The exporter reads queue lengths and counters, nothing else.
METRICS_REFUSED = [
    ("GET", "celery-task-meta-someone"),
    ("LPUSH", "skills.read", "{}"),
    ("LRANGE", "skills.read", "0", "-1"),
    ("HGETALL", "unacked"),
    ("HINCRBY", "cleveragents:metrics:invocations", "forged", "1"),
    ("GET", "cleveragents:claim:write:someone"),
    ("PUBLISH", "/0.celery.pidbox", "{}"),
    ("SUBSCRIBE", "celery-task-meta-someone"),
]
#: A read-only worker never takes a message from a write queue, nor reads, removes or
#: holds one a write worker holds, nor keeps a write worker's heartbeat alive.
READONLY_WORKER_REFUSED = [
    ("HGETALL", "unacked"),
    ("HGET", "unacked", "tag"),
    ("HDEL", "unacked", "tag"),
    ("ZRANGE", "unacked_index", "0", "-1"),
    ("HGETALL", "cleveragents:held"),
    ("HSET", "cleveragents:held", "tag", "holder"),
    ("SET", "cleveragents:alive:someone", "1"),
    ("SET", "cleveragents:reaper", "someone"),
    ("BRPOP", "skills.write", "1"),
    ("BRPOP", "skills.batch.write", "1"),
    ("RPOP", "skills.write"),
    ("LPUSH", "skills.write", "{}"),
    ("LRANGE", "skills.write", "0", "-1"),
]
#: A worker is trusted with the queue, not with Redis.
WORKER_REFUSED = [
    ("FLUSHALL",),
    ("CONFIG", "GET", "*"),
    ("KEYS", "*"),
    ("ACL", "LIST"),
    ("EVAL", "return 1", "0"),
    ("GET", "cleveragents:batch:someone"),
]
REFUSED = [
    *[("producer", command) for command in PRODUCER_REFUSED],
    *[("flower", command) for command in FLOWER_REFUSED],
    *[("metrics", command) for command in METRICS_REFUSED],
    *[("worker-readonly", command) for command in READONLY_WORKER_REFUSED],
    *[("worker", command) for command in WORKER_REFUSED],
]


@pytest.mark.parametrize(
    ("user", "command"), REFUSED, ids=[f"{user}-{' '.join(c)[:40]}" for user, c in REFUSED]
)
def test_each_user_is_refused_what_its_role_does_not_need(
    acl_redis: RedisWithUsers, user: str, command: tuple[str, ...]
) -> None:
    client = redis.Redis.from_url(acl_redis.url(user), socket_timeout=5)
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.execute_command(*command)  # type: ignore[no-untyped-call]
    client.close()
    # Refused by its ACL (logged as such), not by a type error or a missing key
    assert [entry["username"] for entry in acl_redis.denials()] == [user]


@pytest.mark.slow
def test_a_producer_cannot_steer_workers_by_remote_control(
    acl_redis: RedisWithUsers, acl_worker: str, tmp_path: Path
) -> None:
    with producer_client(acl_redis, tmp_path) as client:
        # Broadcast is publishing on /0.celery.pidbox: refused
        with pytest.raises(OperationalError, match="no permissions"):
            client.app.control.broadcast("shutdown", reply=False)
        with pytest.raises(OperationalError, match="no permissions"):
            client.app.control.add_consumer("skills.write", reply=False)
    # And the worker is still there, serving
    assert role_app(acl_redis, "flower").control.inspect(timeout=10, limit=1).ping() == {
        acl_worker: {"ok": "pong"}
    }
    assert {entry["username"] for entry in acl_redis.denials()} == {"producer"}


def test_a_worker_user_of_the_older_rules_binds_and_stores_started_in_two_steps(
    acl_redis: RedisWithUsers, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a worker user set up by the rules before the bind-and-start script: its
    # bind selector does not name the result keys
    admin = acl_redis.admin()
    older = f"older-worker-{uuid.uuid4().hex[:8]}"
    admin.execute_command(  # type: ignore[no-untyped-call]
        "ACL",
        "SETUSER",
        older,
        "on",
        ">pw",
        "-@all",
        "+@connection",
        "+script|load",
        "(~cleveragents:bind:* +set +evalsha)",
        "(~celery-task-meta-* +get +set +evalsha)",
    )
    try:
        client = redis.Redis(port=acl_redis.port, username=older, password="pw")
        store = RedisGuardStore(client, 600, scripted=True)
        writes: list[str] = []
        mark = StartedMark(
            lambda: writes.append("started"), "celery-task-meta-old-1", '{"status": "STARTED"}', 600
        )
        # When it binds a first delivery, twice
        with caplog.at_level(logging.WARNING, logger="cleveragents.stores.redis"):
            assert store.bind_starting("old-1", "d1", mark)[:2] == (None, True)
            assert store.bind_starting("old-2", "d1", mark)[:2] == (None, True)
        # Then it is bound, STARTED went through the backend, and the fix was said once
        assert admin.get("cleveragents:bind:old-1") == b"d1"
        assert writes == ["started", "started"]
        said = [r.getMessage() for r in caplog.records if "~celery-task-meta-*" in r.getMessage()]
        assert len(said) == 1, said
        client.close()
    finally:
        admin.acl_deluser(older)
        admin.acl_log_reset()


@pytest.mark.slow
def test_a_producer_cannot_rebind_a_waiting_request_id_so_that_its_own_request_answers_it(
    tmp_path: Path,
) -> None:
    # A Redis of its own: the victim's write must wait, with no worker, until the attack
    server = RedisWithUsers().start()
    try:
        with producer_client(server, tmp_path / "victim") as victim:
            # Given a victim's write, bound to its content and waiting on skills.write
            rid = f"victim-{uuid.uuid4()}"
            handle = victim.submit(
                "local/notes", "local/write-note", {"name": "v", "text": "mine"},
                allow_writes=True, request_id=rid,
            )  # fmt: skip
            # When a hostile producer, as the producer user, binds the id to a read of its
            # own, and sends that read under it (a worker takes reads before writes)
            forged = {"skill": "local/text-tools", "tool": "local/word-count",
                      "arguments": {"text": "forged forged forged"}}  # fmt: skip
            attacker = redis.Redis.from_url(server.url("producer"))
            for command in (("SET", f"cleveragents:bind:{rid}", content_digest(forged)),
                            ("DEL", f"cleveragents:bind:{rid}")):  # fmt: skip
                with contextlib.suppress(redis.exceptions.NoPermissionError):
                    attacker.execute_command(*command)  # type: ignore[no-untyped-call]
            attacker.close()
            raw = role_app(server, "producer")
            raw.send_task(TASK_INVOKE, args=[forged], task_id=rid, queue=QUEUE_READ)
            raw.close()
            # Then, a worker started, the victim's answer is its own write's
            with compose_worker(server, "worker", tmp_path / "worker"):
                result = handle.result(timeout=60)
        assert result.tool_name == "local/write-note", result
        assert result.success, result.error
    finally:
        server.stop()


def _calls(admin: redis.Redis) -> dict[str, int]:
    """How many binding commands Redis ran since ``CONFIG RESETSTAT``, by name."""
    stats = admin.info("commandstats")
    calls = {name.removeprefix("cmdstat_"): int(s["calls"]) for name, s in stats.items()}
    return {n: c for n, c in calls.items() if n in {"setnx", "get", "set"}}


def test_a_producer_binds_without_replacing_and_the_worker_gives_the_binding_its_time_to_live(
    acl_redis: RedisWithUsers, caplog: pytest.LogCaptureFixture
) -> None:
    admin = acl_redis.admin()
    producer = redis.Redis.from_url(acl_redis.url("producer"))
    worker = redis.Redis.from_url(acl_redis.url("worker"))
    as_producer = RedisGuardStore(producer, 600)
    rid, group = f"ttl-{uuid.uuid4()}", [f"ttl-{uuid.uuid4()}" for _ in range(3)]
    # A producer binds (SETNX: no time to live), and another's binding stays as it is;
    # it reads back only the ids already bound (one command per free id)
    admin.config_resetstat()
    assert as_producer.bind([(rid, "d1"), *((g, "d1") for g in group)]) == [None] * 4
    assert _calls(admin) == {"setnx": 4}
    assert as_producer.bind([(rid, "other"), (f"free-{rid}", "d1"), (group[0], "d1")]) == [
        "d1",
        None,
        "d1",
    ]
    assert _calls(admin) == {"setnx": 7, "get": 2}
    assert admin.get(f"cleveragents:bind:{rid}") == b"d1"
    assert admin.ttl(f"cleveragents:bind:{rid}") == -1
    # The worker, binding a single invocation or a chunk's group, gives it the time to live
    as_worker = RedisGuardStore(worker, 600, scripted=True)
    mark = StartedMark(lambda: None, f"celery-task-meta-{rid}", '{"status": "STARTED"}', 600)
    assert as_worker.bind_starting(rid, "d1", mark)[:2] == ("d1", True)
    assert as_worker.bind([(g, "d1") for g in group]) == ["d1"] * 3
    for key in (rid, *group):
        assert 0 < admin.ttl(f"cleveragents:bind:{key}") <= 600
    assert acl_redis.denials() == []
    # And a producer user of the older rules (SET, no SETNX) still binds, told the fix once
    older = f"older-producer-{uuid.uuid4().hex[:8]}"
    admin.execute_command(  # type: ignore[no-untyped-call]
        "ACL", "SETUSER", older, "on", ">pw", "-@all", "+@connection", "(~cleveragents:bind:* +set)"
    )
    try:
        old = RedisGuardStore(redis.Redis(port=acl_redis.port, username=older, password="pw"), 600)
        with caplog.at_level(logging.WARNING, logger="cleveragents.stores.redis"):
            assert old.bind([(f"old-{rid}", "d1")]) == [None]
            assert old.bind([(f"old-{rid}", "d2")]) == ["d1"]
        said = [r.getMessage() for r in caplog.records if "+setnx +get" in r.getMessage()]
        assert len(said) == 1, said
    finally:
        admin.acl_deluser(older)
        admin.acl_log_reset()
    for client in (producer, worker):
        client.close()
