"""RabbitMQ as broker: its settings, its delivery-limit backstop, and faults on it.

The queue, batch and CLI tests of the other files run on RabbitMQ too (their
``broker`` fixture). Here is what only RabbitMQ has: quorum queues with a delivery
limit and the ``skills.dead`` queue behind it, and recovery from a dead worker,
which on RabbitMQ needs no visibility timeout: a closed connection hands its
unacknowledged messages back at once.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import kombu
import pytest

from cleveragents.broker.celery_settings import celery_settings
from cleveragents.client import SkillClient
from cleveragents.constants import (
    DELIVERY_LIMIT,
    QUEUE_BATCH,
    QUEUE_BATCH_WRITE,
    QUEUE_DEAD,
    QUEUE_READ,
    QUEUE_WRITE,
)
from cleveragents.pipeline.guard import MAX_ATTEMPTS
from cleveragents.settings import Settings
from cleveragents.skills import SkillErrorType
from tests.support.fault_rig import (
    POISON,
    READ,
    WRITE,
    Rig,
    reason,
    request,
    rig,
    submit,
)
from tests.support.fault_scenarios import scenario_poison, scenario_worker_kill
from tests.support.procs import kill_group, wait_until
from tests.support.prom import scrape
from tests.support.rabbit import queue_state

pytestmark = pytest.mark.timeout(90)

SKILL_QUEUES = (QUEUE_READ, QUEUE_WRITE, QUEUE_BATCH, QUEUE_BATCH_WRITE)
AMQP = "amqp://guest:guest@127.0.0.1:5672/some-vhost"


# --- settings, without a server -----------------------------------------------------------


def test_the_delivery_limit_is_a_backstop_above_the_guards_own_limit() -> None:
    # The guard ends a poison invocation after MAX_ATTEMPTS returns of its message, a
    # chunk holding three of them after 3 x MAX_ATTEMPTS: RabbitMQ must not end them first.
    assert DELIVERY_LIMIT >= 3 * MAX_ATTEMPTS


@pytest.mark.parametrize("read_only", [False, True])
def test_every_process_declares_the_same_four_quorum_queues(read_only: bool) -> None:
    env = {"CLEVERAGENTS_BROKER_URL": AMQP, "CLEVERAGENTS_RESULT_BACKEND": "redis://r:6379/0"}
    if read_only:
        env["CLEVERAGENTS_READ_ONLY"] = "1"
    conf = celery_settings(Settings.from_env(env))
    queues = {q.name: q for q in conf["task_queues"]}

    # RabbitMQ refuses a queue declared again with other arguments: a read-only worker
    # (which leaves the write queues at start) declares them the same as everyone.
    assert set(queues) == set(SKILL_QUEUES)
    for name, queue in queues.items():
        assert queue.queue_arguments == {
            "x-queue-type": "quorum",
            "x-delivery-limit": DELIVERY_LIMIT,
            "x-dead-letter-exchange": QUEUE_DEAD,
            "x-dead-letter-routing-key": QUEUE_DEAD,
        }
        assert queue.durable
        assert not queue.auto_delete
        assert not queue.exclusive
        assert (queue.exchange.name, queue.exchange.type, queue.routing_key) == (
            name,
            "direct",
            name,
        )
    assert conf["broker_transport_options"] == {"confirm_publish": True}
    # RabbitMQ gives up on a silent worker within half of CLEVERAGENTS_RECOVERY_S (default
    # 30), as Redis does: 2 to 3 heartbeats of 5 s.
    assert conf["broker_heartbeat"] == 5
    recovery = Settings.from_env({**env, "CLEVERAGENTS_RECOVERY_S": "4"})
    assert celery_settings(recovery)["broker_heartbeat"] == 1
    # Late acks and one message per process, as on Redis (celery_settings._delivery).
    assert conf["task_acks_late"]
    assert conf["task_reject_on_worker_lost"]
    assert conf["worker_prefetch_multiplier"] == 1


def test_workers_leave_out_celerys_native_delayed_delivery() -> None:
    # On quorum queues Celery would declare 28 exchanges and 28 quorum queues per virtual
    # host for messages with an ETA; no skill message has one (cleveragents/worker/admission.py).
    from celery.worker.consumer import Consumer

    from cleveragents.worker.consumer import SkillConsumer

    step = "celery.worker.consumer.delayed_delivery:DelayedDelivery"
    assert step in Consumer.Blueprint.default_steps, "Celery renamed the step: update the filter"
    assert step not in SkillConsumer.Blueprint.default_steps


def test_redis_queues_stay_plain_lists_without_arguments() -> None:
    conf = celery_settings(Settings.from_env({"CLEVERAGENTS_BROKER_URL": "redis://r:6379/0"}))
    assert all(not q.queue_arguments for q in conf["task_queues"])
    assert "broker_heartbeat" not in conf
    assert "visibility_timeout" in conf["broker_transport_options"]


# --- the delivery limit -------------------------------------------------------------------


def test_a_message_past_the_delivery_limit_is_dead_lettered_not_dropped(
    rabbit_url: str, redis_url: str
) -> None:
    # Given an invocation waiting in skills.read (the producer declared the queues)
    env = {"CLEVERAGENTS_BROKER_URL": rabbit_url, "CLEVERAGENTS_RESULT_BACKEND": redis_url}
    with SkillClient(settings=Settings.from_env(env)) as client:
        handle = client.submit("local/text-tools", "local/word-count", {"text": "a"})
    # When it is handed out and given back once more than the limit allows (as a
    # worker that dies before its task runs would, again and again)
    deliveries = 0
    with kombu.Connection(rabbit_url) as connection:
        queue = kombu.Queue(QUEUE_READ)(connection.default_channel)
        while (message := _get(queue)) is not None:
            deliveries += 1
            message.requeue()
            assert deliveries <= DELIVERY_LIMIT + 1, "the delivery limit did not apply"
        # Then RabbitMQ moved it to skills.dead, with why, instead of dropping it
        dead = _get(kombu.Queue(QUEUE_DEAD)(connection.default_channel))
        assert dead is not None
        assert dead.headers["id"] == handle.request_id
        assert dead.headers["x-first-death-reason"] == "delivery_limit"
        assert dead.headers["x-first-death-queue"] == QUEUE_READ
        dead.requeue()
    assert deliveries == DELIVERY_LIMIT + 1
    # and the exporter shows it waiting there
    samples = scrape(rabbit_url, redis_url)
    lengths = {
        dict(labels)["queue"]: n for (name, labels), n in samples.items() if "length" in name
    }
    assert lengths == {**dict.fromkeys(SKILL_QUEUES, 0), QUEUE_DEAD: 1}
    # with no age: RabbitMQ tells none without handing the message out, and a 0 would
    # read as "nothing waits"
    assert not [name for name, _ in samples if name == "cleveragents_queue_oldest_age_seconds"]


def _get(queue: kombu.Queue, wait_s: float = 1.0) -> kombu.Message | None:
    """The next message of ``queue``, waiting up to ``wait_s`` for one (a return is async)."""
    deadline = time.monotonic() + wait_s
    while (message := queue.get()) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return message


# --- faults ------------------------------------------------------------------------------


@pytest.fixture
def rabbit_rig(tmp_path: Path, rabbit_url: str) -> Iterator[Rig]:
    """The fault rig with RabbitMQ as broker; its private redis-server keeps the results."""
    with rig(tmp_path / "rig", broker=rabbit_url) as made:
        yield made


def test_a_worker_killed_mid_tool_hands_its_invocations_to_the_next_worker_at_once(
    rabbit_rig: Rig,
) -> None:
    # Given a read and a non-idempotent write, each running a 30 s tool on worker A
    r = rabbit_rig
    first = r.start_worker(concurrency=2)
    client = r.client()
    keys = {tool: f"k-{tool.split('/')[1]}-{os.urandom(3).hex()}" for tool in (READ, WRITE)}
    for tool, key in keys.items():
        submit(client, request(tool, key, r.records.path, sleep_s=30, first_only=True))
    wait_until(lambda: set(keys.values()) <= set(r.records.counts()), 30, "both tools to start")

    # When worker A is killed outright (SIGKILL, every process) and worker B starts
    assert first.proc is not None
    kill_group(first.proc)
    first.proc.wait(10)
    killed = time.monotonic()
    r.start_worker(concurrency=2)
    results = {tool: client.wait(key, timeout=30) for tool, key in keys.items()}
    recovered_s = time.monotonic() - killed

    # Then B ran the read again at once (no visibility timeout to wait out)
    print(f"both results {recovered_s:.1f}s after the kill (worker start included)")
    assert recovered_s < 10, recovered_s
    read = results[READ]
    assert read.success, read.error
    assert r.records.counts()[keys[READ]] == 2
    # RabbitMQ marked it redelivered, and the guard counted it towards the poison limit
    assert r.attempts(keys[READ]) == 1
    # and did not run the write again: it may or may not have happened
    write = results[WRITE]
    assert r.records.counts()[keys[WRITE]] == 1
    assert write.error is not None
    assert write.error.error_type == SkillErrorType.TOOL_EXECUTION_FAILURE
    assert reason(write) == "write_interrupted"


def test_a_worker_that_stops_answering_loses_its_invocations_within_the_recovery_time(
    rabbit_rig: Rig,
) -> None:
    # Given a read running a 30 s tool on worker A (CLEVERAGENTS_RECOVERY_S: the rig's)
    r = rabbit_rig
    assert r.recovery_s is not None
    first = r.start_worker(concurrency=1)
    client = r.client()
    key = f"frozen-{os.urandom(3).hex()}"
    submit(client, request(READ, key, r.records.path, sleep_s=30, first_only=True))
    wait_until(lambda: r.records.counts()[key] == 1, 30, "the tool to start")

    # When worker A stops answering, its connection open (SIGSTOP: a hung or cut-off
    # machine), and worker B is there
    assert first.proc is not None
    os.killpg(first.proc.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        r.start_worker(concurrency=1)
        result = client.wait(key, timeout=30)
        recovered_s = time.monotonic() - stopped
    finally:
        os.killpg(first.proc.pid, signal.SIGCONT)

    # Then RabbitMQ gave A up after missed heartbeats and B ran the read again
    print(f"result {recovered_s:.1f}s after A stopped (recovery time {r.recovery_s:g}s)")
    assert result.success, result.error
    assert r.records.counts()[key] == 2
    assert recovered_s < r.recovery_s + 3, recovered_s  # B's start-up and the rerun


def test_a_batch_whose_worker_is_killed_completes_on_a_new_worker_at_once(
    rabbit_rig: Rig,
) -> None:
    outcome = scenario_worker_kill(rabbit_rig, 60, restart_after_s=0.0, deadline_s=30)

    print(outcome)
    assert outcome.client_error is None, outcome
    assert outcome.lost == 0, outcome
    assert outcome.write_dupes == 0, outcome
    assert outcome.recover_s is not None, outcome
    assert outcome.recover_s < 15, outcome


def test_a_poison_invocation_is_ended_by_the_guard_before_rabbitmqs_limit(
    rabbit_rig: Rig,
) -> None:
    seen = scenario_poison(rabbit_rig)
    print(f"poison ended after {seen['elapsed_s']:.1f}s")

    result = seen["result"]
    assert result.error is not None
    assert reason(result) == "poison_message"
    assert seen["runs"] == MAX_ATTEMPTS  # RabbitMQ marked each return as redelivered
    assert seen["served_after"]
    assert seen["worker_alive"]
    assert len(seen["dead_letters"]) == 1  # the guard's redacted record
    assert rabbit_rig.broker is not None
    assert queue_state(rabbit_rig.broker, QUEUE_DEAD)[0] == 0  # the backstop never acted
    assert result.tool_name == POISON
