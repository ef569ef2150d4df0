"""Recovery bounded by liveness, not by tool length (cleveragents/broker/redis/transport.py).

A worker killed whole (SIGKILL of its process group, a lost machine) leaves its
messages unacknowledged in Redis. Every worker beats, every delivery records which
worker holds it, and a reaper gives back what a worker whose beat has stopped held:
its invocations run again within ``CLEVERAGENTS_RECOVERY_S``, however long the
visibility timeout. A live worker's message is never handed out again, however
long its tool runs. Writes still run at most once, and a message given back counts
as a delivery towards the poison limit.

Workers, Redis and tools are real (``tests/support/fault_rig.py``); ``CLEVERAGENTS_RECOVERY_S``
is a few seconds here to keep the file short.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from celery import Celery
from kombu import Connection, Exchange, Producer, Queue
from kombu import Consumer as KombuConsumer
from redis.backoff import NoBackoff
from redis.retry import Retry

from cleveragents.broker.celery_settings import (
    REDIS_TRANSPORT,
    SENTINEL_TRANSPORT,
    celery_settings,
    consumer_transport,
)
from cleveragents.broker.redis.fetch import FETCH_LUA, door_key, fetch_command
from cleveragents.broker.redis.liveness import Heartbeat, RecoveryTiming, alive_key
from cleveragents.broker.redis.transport import Channel, QoS
from cleveragents.constants import FIRST_RUN_POLL_S, HELD_KEY, REAPER_KEY
from cleveragents.errors import ConfigurationError
from cleveragents.settings import Settings
from cleveragents.skills import SkillErrorType
from tests.support.fault_rig import READ, WRITE, reason, rig
from tests.support.fault_scenarios import (
    scenario_dead_worker,
    scenario_frozen_worker,
    scenario_live_long_tool,
)
from tests.support.procs import free_port, wait_until

#: CLEVERAGENTS_RECOVERY_S of the workers below.
RECOVERY_S = 5.0
#: Slack for a test machine: a worker's start-up, a busy CPU.
MARGIN_S = 10.0
#: A visibility timeout nobody waits for in a test.
LONG_VISIBILITY_S = 900.0


# --------------------------------------------------------------------------- the transport


#: Recovery timing of the in-process tests: a holder is dead 0.5 s after its last beat.
FAST = RecoveryTiming.of(1.0)


@dataclass
class Consumer:
    """One channel of the transport, as a worker's consumer uses it, with its heartbeat."""

    connection: Connection
    channel: Channel
    heartbeat: Heartbeat
    queue: Queue

    @property
    def qos(self) -> QoS:
        return cast(QoS, self.channel.qos)

    def take(self) -> Any:
        message = self.queue(self.channel).get(no_ack=False)
        assert message is not None, "nothing to take"
        return message


@pytest.fixture
def consumers(redis_url: str) -> Iterator[Callable[..., Consumer]]:
    """Channels of the transport on the test Redis; each with a heartbeat of its own."""
    made: list[Consumer] = []

    def make(*, beating: bool = True, visibility_s: float = 3600.0) -> Consumer:
        connection = Connection(
            redis_url,
            transport=REDIS_TRANSPORT,
            transport_options={"recovery_s": FAST.recovery_s, "visibility_timeout": visibility_s},
        )
        channel = cast(Channel, connection.channel())
        qos = cast(QoS, channel.qos)
        heartbeat = Heartbeat(redis.Redis.from_url(redis_url), channel.recovery_timing)
        qos._heartbeat = heartbeat  # this process's stand-in, stopped below
        if beating:
            heartbeat.hold(qos.holder)
        queue = Queue("t.recovery", Exchange("t.recovery", type="direct"), "t.recovery")
        queue(channel).declare()
        consumer = Consumer(connection, channel, heartbeat, queue)
        made.append(consumer)
        return consumer

    yield make
    for consumer in made:
        consumer.heartbeat.stop()
        consumer.connection.release()


def _publish(consumer: Consumer, body: dict[str, Any]) -> None:
    Producer(consumer.channel).publish(
        body, exchange=consumer.queue.exchange, routing_key="t.recovery", serializer="json"
    )


def _held(redis_url: str) -> dict[str, str]:
    raw = redis.Redis.from_url(redis_url, decode_responses=True).hgetall(HELD_KEY)
    return {str(tag): str(holder) for tag, holder in raw.items()}


def _steady(consumer: Consumer) -> None:
    wait_until(consumer.heartbeat.steady, 5, "the heartbeat to be steady")


def _reap(consumer: Consumer) -> int:
    # Not a wait for an event: a reaper looks once per reap_s at most (its own clock), and
    # a call before that returns 0 without looking
    time.sleep(FAST.reap_s)
    return consumer.qos.reap()


def test_a_delivery_records_its_holder_which_an_ack_a_reject_and_a_close_remove(
    redis_url: str, consumers: Callable[..., Consumer]
) -> None:
    server = redis.Redis.from_url(redis_url)
    worker = consumers()
    for n in range(3):
        _publish(worker, {"n": n})
    # Each delivery: held by the channel's holder, whose heartbeat key exists
    acked, rejected, kept = worker.take(), worker.take(), worker.take()
    holder = worker.qos.holder
    assert _held(redis_url) == dict.fromkeys(
        [acked.delivery_tag, rejected.delivery_tag, kept.delivery_tag], holder
    )
    assert server.exists(alive_key(holder))
    acked.ack()
    rejected.reject(requeue=True)
    assert _held(redis_url) == {kept.delivery_tag: holder}
    # A closed channel gives back what it held (kombu), and its holder stops beating
    worker.channel.close()
    assert _held(redis_url) == {}
    assert server.hlen("unacked") == 0
    assert server.llen("t.recovery") == 2
    assert not worker.heartbeat.holds(holder)
    wait_until(lambda: not server.exists(alive_key(holder)), 5, "the holder's key deleted")


def test_the_reaper_gives_back_a_dead_holders_message_marked_redelivered_at_the_head(
    redis_url: str, consumers: Callable[..., Consumer]
) -> None:
    server = redis.Redis.from_url(redis_url)
    # Given a holder that took a message and never beat again (a killed worker)
    dead = consumers(beating=False)
    _publish(dead, {"n": "first"})
    _publish(dead, {"n": "second"})
    taken = dead.take()
    wait_until(lambda: not server.exists(alive_key(dead.qos.holder)), 5, "its key to expire")
    # When a worker that has beaten steadily for a whole TTL reaps
    reaper = consumers()
    _steady(reaper)
    assert _reap(reaper) == 1
    # Then the message is back, first in line, marked redelivered, held by nobody
    assert _held(redis_url) == {}
    assert server.hlen("unacked") == 0
    again = reaper.take()
    assert again.delivery_tag == taken.delivery_tag
    assert again.delivery_info["redelivered"] is True
    assert again.payload == {"n": "first"}
    assert _held(redis_url) == {again.delivery_tag: reaper.qos.holder}


def test_the_reaper_leaves_a_live_holders_message_and_a_new_reaper_judges_nobody(
    redis_url: str, consumers: Callable[..., Consumer]
) -> None:
    server = redis.Redis.from_url(redis_url)
    live = consumers()
    dead = consumers(beating=False)
    _publish(live, {"n": 1})
    _publish(live, {"n": 2})
    live.take()
    dead.take()
    wait_until(lambda: not server.exists(alive_key(dead.qos.holder)), 5, "the dead key to expire")
    # A reaper that has not beaten for a whole TTL yet (just started, or back from an
    # outage) gives back nothing: live holders may not have beaten again yet
    fresh = consumers()
    assert not fresh.heartbeat.steady()
    assert _reap(fresh) == 0
    # Once steady, it acts when it holds the reaper's lock (one reaper at a time), and
    # gives back only the dead holder's message
    _steady(fresh)
    server.set(REAPER_KEY, "another worker", px=60_000)
    assert _reap(fresh) == 0
    server.delete(REAPER_KEY)
    assert _reap(fresh) == 1
    assert set(_held(redis_url).values()) == {live.qos.holder}
    assert server.llen("t.recovery") == 1


def test_the_visibility_sweep_passes_by_a_live_holders_message_but_not_an_unheld_one(
    redis_url: str, consumers: Callable[..., Consumer]
) -> None:
    server = redis.Redis.from_url(redis_url)
    holder = consumers()
    sweeper = consumers(visibility_s=1.0)
    for n in range(2):
        _publish(holder, {"n": n})
    live, unheld = holder.take(), holder.take()
    server.hdel(HELD_KEY, unheld.delivery_tag)  # as a consumer on kombu's own transport
    long_ago = time.time() - 3600
    server.zadd("unacked_index", {live.delivery_tag: long_ago, unheld.delivery_tag: long_ago})
    _steady(sweeper)
    # When kombu's sweep finds both past the visibility timeout
    sweeper.qos.restore_visible(num=10, interval=1)
    # Then the unheld one is back in its queue, and the live holder keeps its own,
    # looked at again a visibility timeout from now
    assert server.llen("t.recovery") == 1
    assert set(_held(redis_url)) == {live.delivery_tag}
    score = server.zscore("unacked_index", live.delivery_tag)
    assert score is not None
    assert score > time.time() - 60


def _fetch(consumer: Consumer, server: redis.Redis) -> Any:
    """Run the fetch script as the consumer's channel would, and drop its reply."""
    channel = consumer.channel
    server.script_load(FETCH_LUA)
    command = fetch_command(
        channel._fetch_sha,
        queue_keys=[channel._q_for_pri("t.recovery", pri) for pri in channel.priority_steps],
        queues=["t.recovery"],
        unacked=(channel.unacked_key, channel.unacked_index_key),
        holder=consumer.qos.holder,
        alive=alive_key(consumer.qos.holder),
        ttl_ms=FAST.ttl_ms,
        now=time.time(),
    )
    return server.execute_command(*command)  # type: ignore[no-untyped-call]


def test_a_fetch_holds_its_message_before_the_reply_leaves_redis_and_a_lost_one_comes_back(
    redis_url: str, consumers: Callable[..., Consumer]
) -> None:
    server = redis.Redis.from_url(redis_url)
    worker = consumers()
    _publish(worker, {"n": "in flight"})
    assert server.llen(door_key("t.recovery")) == 1  # the publish rang the doorbell
    # When the script takes the message and its reply never reaches the worker
    queue_key, item = _fetch(worker, server)
    assert queue_key == b"t.recovery"
    tag = json.loads(item)["properties"]["delivery_tag"]
    # Then Redis already holds it for the worker, in kombu's own unacknowledged record
    assert _held(redis_url) == {tag: worker.qos.holder}
    message, exchange, routing_key = json.loads(server.hget("unacked", tag) or b"")
    assert (message, exchange, routing_key) == (json.loads(item), "t.recovery", "t.recovery")
    assert server.zscore("unacked_index", tag) is not None
    assert server.llen("t.recovery") == 0
    # An empty fetch empties the doorbells: nothing rings for a message already taken
    assert _fetch(worker, server) is None
    assert not server.exists(door_key("t.recovery"))
    # And the worker gives back what it holds but never received, marked redelivered
    assert worker.qos.give_back_lost(server) == 1
    assert _held(redis_url) == {}
    again = worker.take()
    assert again.delivery_tag == tag
    assert again.delivery_info["redelivered"] is True
    assert again.payload == {"n": "in flight"}
    # What it did receive stays its own
    assert worker.qos.give_back_lost(server) == 0
    assert _held(redis_url) == {tag: worker.qos.holder}


def test_a_consumer_takes_its_messages_with_the_fetch_script_and_holds_each_once(
    redis_url: str, consumers: Callable[..., Consumer]
) -> None:
    server = redis.Redis.from_url(redis_url)
    worker = consumers()
    got: list[Any] = []
    fetches = _calls(server, "evalsha")
    with KombuConsumer(worker.channel, [worker.queue], callbacks=[lambda _, m: got.append(m)]):
        for n in range(3):
            _publish(worker, {"n": n})
        wait_until(lambda: _drain(worker) and len(got) == 3, 10, "three deliveries")
    assert _calls(server, "evalsha") >= fetches + 3  # taken by the script, not BRPOP
    assert [m.payload for m in got] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert _held(redis_url) == {m.delivery_tag: worker.qos.holder for m in got}
    assert worker.qos.recorded == set()  # each recorded by the script, not again
    for m in got:
        m.ack()
    assert _held(redis_url) == {}
    assert server.hlen("unacked") == 0


def _calls(server: redis.Redis, command: str) -> int:
    stats: dict[str, Any] = server.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


def _drain(consumer: Consumer) -> bool:
    with contextlib.suppress(TimeoutError):
        consumer.connection.drain_events(timeout=0.5)
    return True


def test_a_heartbeat_is_steady_only_after_a_whole_ttl_of_successful_beats(
    redis_url: str,
) -> None:
    beat = Heartbeat(redis.Redis.from_url(redis_url), FAST)
    assert beat.beat()
    assert not beat.steady()
    time.sleep(FAST.ttl_s)  # the clock under test: steady after a whole TTL of beats
    assert beat.beat()
    assert beat.steady()
    # A beat that fails (Redis gone) starts the count again
    beat.client = redis.Redis(port=free_port(), retry=Retry(NoBackoff(), 0))
    assert not beat.beat()
    assert not beat.steady()


def test_the_recovery_time_is_read_from_the_environment_and_bounds_the_timing() -> None:
    assert Settings.from_env({}).recovery_s == 30.0
    assert Settings.from_env({"CLEVERAGENTS_RECOVERY_S": "5"}).recovery_s == 5.0
    with pytest.raises(ConfigurationError, match="CLEVERAGENTS_RECOVERY_S must be positive"):
        Settings.from_env({"CLEVERAGENTS_RECOVERY_S": "0"})
    timing = RecoveryTiming.of(30.0)
    # Several missed beats before a holder is dead; seen dead, and given back, well within R
    assert timing.ttl_s >= 5 * timing.beat_s
    assert timing.ttl_s + 2 * timing.reap_s <= 0.75 * timing.recovery_s


@pytest.mark.parametrize(
    ("url", "transport", "ssl_options"),
    [
        ("redis://:secret@127.0.0.1:6390/3", REDIS_TRANSPORT, False),
        # kombu's own default for a rediss:// URL without ssl_* parameters
        ("rediss://user:secret@127.0.0.1:6390/3", REDIS_TRANSPORT, {"ssl_cert_reqs": 0}),
        (
            "rediss://user:secret@127.0.0.1:6390/3?ssl_cert_reqs=required",
            REDIS_TRANSPORT,
            {"ssl_cert_reqs": 2},
        ),
        # Sentinel gets the same transport over kombu's Sentinel channel (broker/redis/sentinel.py)
        ("sentinel://:secret@127.0.0.1:6390/3", SENTINEL_TRANSPORT, False),
    ],
)
def test_redis_urls_get_the_transport_and_keep_their_address_credentials_and_tls(
    url: str, transport: str, ssl_options: Any
) -> None:
    settings = Settings.from_env(
        {"CLEVERAGENTS_BROKER_URL": url, "CLEVERAGENTS_RESULT_BACKEND": "redis://127.0.0.1/0"}
    )
    app = Celery(set_as_current=False)
    app.conf.update(celery_settings(settings))
    # Producers, Flower and inspect keep kombu's own transport; a worker sets its own at start
    assert app.conf.broker_transport is None
    if consumer_transport(settings) is not None:
        app.conf.broker_transport = consumer_transport(settings)
    with app.connection_for_write() as connection:
        assert connection.transport_cls == transport
        assert (connection.hostname, connection.port) == ("127.0.0.1", 6390)
        assert (connection.password, connection.virtual_host) == ("secret", "3")
        assert connection.ssl == ssl_options
        assert (connection.transport_options or {})["recovery_s"] == 30.0


# --------------------------------------------------------------------------- a dead worker


@pytest.fixture(scope="module")
def dead_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One kill of a worker running a long read and a long write, measured once."""
    root = tmp_path_factory.mktemp("dead-worker") / "rig"
    with rig(root, visibility_s=LONG_VISIBILITY_S, recovery_s=RECOVERY_S) as made:
        yield scenario_dead_worker(
            made, tools=(READ, WRITE), sleep_s=60.0, deadline_s=RECOVERY_S + MARGIN_S
        )


@pytest.mark.timeout(90)
def test_a_dead_workers_invocation_runs_again_within_the_recovery_time(
    dead_worker: dict[str, Any],
) -> None:
    # Given a worker killed whole while it ran a read, and a new worker started at once,
    # with a visibility timeout of 15 minutes
    read = dead_worker[READ]
    # Then the read ran again, on the new worker, well before the visibility timeout
    assert dead_worker["recover_s"] is not None, dead_worker
    assert dead_worker["recover_s"] < RECOVERY_S + MARGIN_S, dead_worker
    assert read["result"].success, read
    assert len(read["pids"]) == 2, read
    assert read["pids"][1] in dead_worker["second_pids"], (read, dead_worker["second_pids"])


@pytest.mark.timeout(90)
def test_a_dead_workers_write_is_not_run_again(dead_worker: dict[str, Any]) -> None:
    write = dead_worker[WRITE]
    # The new worker got it back, and did not run it: it may or may not have happened.
    assert len(write["pids"]) == 1, write
    result = write["result"]
    assert result is not None, write
    assert result.error is not None, write
    assert result.error.error_type == SkillErrorType.TOOL_EXECUTION_FAILURE
    assert reason(result) == "write_interrupted"


@pytest.mark.timeout(90)
def test_a_message_given_back_from_a_dead_worker_counts_as_a_delivery(
    dead_worker: dict[str, Any],
) -> None:
    # Marked redelivered, as kombu marks what it restores: the guard counted it once
    # (a first delivery is not counted), so a poison message still ends.
    assert dead_worker[READ]["counted"] == 1, dead_worker[READ]
    assert dead_worker[WRITE]["counted"] == 1, dead_worker[WRITE]


# --------------------------------------------------------------------------- live workers


@pytest.mark.timeout(90)
def test_a_live_workers_long_tool_is_never_handed_out_again(tmp_path: Path) -> None:
    # Given a recovery time of 3 s and a visibility timeout of 4 s, and a second worker
    # idle beside the one that runs the read
    with rig(tmp_path / "rig", visibility_s=4.0, recovery_s=3.0) as made:
        # When the read runs for longer than three recovery times and the visibility timeout
        seen = scenario_live_long_tool(made, tool=READ, sleep_s=10.0)
    # Then it ran once, and the idle worker never received it
    assert seen["result"].success, seen
    assert seen["runs"] == 1, seen
    assert seen["received"] == [1, 0], seen


@pytest.mark.timeout(90)
def test_a_write_of_a_worker_that_only_looked_dead_still_runs_once(tmp_path: Path) -> None:
    # Given a worker whose main process stops (SIGSTOP) while its pool process writes:
    # it stops beating, as when it is cut off from Redis
    with rig(tmp_path / "rig", visibility_s=LONG_VISIBILITY_S, recovery_s=3.0) as made:
        seen = scenario_frozen_worker(made, sleep_s=12.0, frozen_s=11.0)
    # Then its message was handed to the second worker, which waited for the first run,
    # asking again about once a second without holding a process (at most the 12 s run)
    assert 2 <= seen["deliveries"] <= 2 + 12.0 / FIRST_RUN_POLL_S + 4, seen  # 4: a busy machine
    assert seen["runs"] == 1, seen
    assert seen["result"].success, seen
    assert seen["final"] == seen["result"]
    # And a delivery that found the first run alive was not counted towards poison
    assert seen["counted"] == 0, seen
