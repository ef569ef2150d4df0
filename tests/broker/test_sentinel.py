"""A fleet on Redis Sentinel (``sentinel://`` broker and result backend) whose primary is
killed mid-stream of writes: the Sentinels promote the replica, producers and the worker
find it by themselves, nothing is lost, no write runs twice.

Real processes only: a private primary, replica and three Sentinels
(``tests/support/sentinel.py``), a real worker, a real producer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cleveragents.broker.redis.sentinel import sentinel_client
from cleveragents.client import SkillClient
from cleveragents.constants import AUDIT_KEY, CLAIM_KEY_PREFIX
from cleveragents.metrics.exporter import render
from cleveragents.settings import Settings
from tests.conftest import worker_env
from tests.support.fault_rig import (
    WRITE,
    Outcome,
    Records,
    request,
    stored_results,
    submit,
    tally,
    wait_results,
)
from tests.support.procs import Worker, wait_until
from tests.support.sentinel import MASTER, SentinelFleet, sentinel_fleet

pytestmark = pytest.mark.timeout(150)

#: CLEVERAGENTS_RECOVERY_S of the test's worker and producer.
RECOVERY_S = 4.0


#: Seconds between two writes of the stream: 4 a second, well under what the worker's two
#: processes serve (0.2 s each), so that no backlog builds and a write sent as the
#: primary dies waits for the failover and the recovery, not for a queue.
EVERY_S = 0.25


class WriteStream:
    """Writes that must run once, submitted one after another from a thread until stopped."""

    def __init__(self, client: SkillClient, records: Records, *, sleep_s: float) -> None:
        self.client, self.records, self.sleep_s = client, records, sleep_s
        self.sent: list[dict[str, Any]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="writes")

    def _run(self) -> None:
        n = 0
        while not self.stop.is_set():
            body = request(WRITE, f"w-{n:04d}", self.records.path, sleep_s=self.sleep_s)
            submit(self.client, body)  # rides out the failover (Celery's publish retries)
            self.sent.append(body)
            n += 1
            self.stop.wait(EVERY_S)

    def stored(self) -> int:
        ids = [body["request_id"] for body in list(self.sent)]
        try:
            return sum(1 for r in stored_results(self.client, ids).values() if r is not None)
        except Exception:  # the primary away: nothing is known stored
            return 0


@pytest.fixture
def fleet() -> Iterator[SentinelFleet]:
    with sentinel_fleet() as made:
        yield made


def _client(fleet: SentinelFleet, home: Path) -> SkillClient:
    env = {
        "CLEVERAGENTS_BROKER_URL": fleet.url,
        "CLEVERAGENTS_RESULT_BACKEND": fleet.url,
        "CLEVERAGENTS_HOME": str(home),
        "CLEVERAGENTS_RECOVERY_S": f"{RECOVERY_S:g}",
    }
    return SkillClient(settings=Settings.from_env(env))


def _probe_after_kill(client: SkillClient, records: Records, box: list[float]) -> None:
    """A write sent as the primary dies, its result awaited as a producer awaits one
    (Celery's subscription, across the failover); when it came, into ``box``."""
    body = request(WRITE, "probe", records.path)
    fields = ("skill", "tool", "arguments", "allow_writes", "request_id")
    handle = client.submit(client.build_request(**{k: body[k] for k in fields}))
    if handle.result(timeout=60).success:
        box.append(time.monotonic())


def _write_running(records: Records) -> bool:
    """True when a write started within its sleep (0.2 s): it runs now."""
    return any(at > time.time() - 0.15 for _, _, at in records.lines()[-4:])


def test_a_killed_primary_loses_no_write_and_runs_none_twice(
    fleet: SentinelFleet, tmp_path: Path
) -> None:
    # Given a worker and a producer on sentinel:// URLs, and a stream of writes
    records = Records(tmp_path / "records")
    env = worker_env(
        fleet.url, CLEVERAGENTS_HOME=str(tmp_path / "home"), CLEVERAGENTS_RECOVERY_S="4"
    )
    worker = Worker(env, concurrency=2).start()
    try:
        client = _client(fleet, tmp_path / "home")
        stream = WriteStream(client, records, sleep_s=0.2)
        stream.thread.start()
        wait_until(lambda: stream.stored() >= 8, 60, "the first writes stored")
        # When the primary is killed mid-stream (a write running) and the replica promoted
        wait_until(lambda: _write_running(records), 10, "a write running")
        old = fleet.primary_port()
        assert old is not None
        probe_done: list[float] = []
        killed = fleet.kill_primary()
        probe = threading.Thread(target=_probe_after_kill, args=(client, records, probe_done))
        probe.start()
        promoted = fleet.wait_failover(old)
        sent_at_kill = len(stream.sent)
        wait_until(lambda: len(stream.sent) >= sent_at_kill + 12, 60, "writes after failover")
        stream.stop.set()
        stream.thread.join(60)
        probe.join(90)
        ids = [body["request_id"] for body in stream.sent]
        results = wait_results(client, ids, 60)
    finally:
        log = worker.log_text()
        worker.stop()
    outcome = tally(Outcome("sentinel failover", len(ids)), stream.sent, results, records)
    # Then nothing is lost and no write ran twice
    assert outcome.lost == 0, (outcome, log[-3000:])
    assert outcome.write_dupes == 0, outcome
    # And the write sent as the primary died was served within the recovery time after
    # the failover, with no manual step
    assert probe_done, "the write sent as the primary died has no result"
    failover_s, recovered_s = promoted - killed, probe_done[0] - killed
    print(f"failover {failover_s:.1f} s, first write after the kill stored {recovered_s:.1f} s")
    assert recovered_s <= failover_s + RECOVERY_S + 2, (failover_s, recovered_s)
    # And the stores followed the primary: the claims of writes sent after it are on it
    # (the guard's claims, the audit trail's events: every store uses the backend's client)
    with fleet.primary() as primary:
        claim = f"{CLAIM_KEY_PREFIX}write:{ids[-1]}"
        assert primary.exists(claim), claim
        trail = repr(primary.xrange(AUDIT_KEY)).encode()
        assert ids[-1].encode() in trail, "the last write's audit events are not on it"


def test_the_metrics_exporters_client_follows_the_primary(fleet: SentinelFleet) -> None:
    # Given the client `cleveragents metrics` makes of a sentinel:// URL, in use
    client = sentinel_client(fleet.url, MASTER, socket_timeout=5)
    assert "cleveragents_queue_length" in render(client, None)
    # When the primary is killed and a replica promoted
    old = fleet.primary_port()
    assert old is not None
    fleet.kill_primary()
    fleet.wait_failover(old)
    # Then the same client reads the new primary, with no manual step
    assert "cleveragents_queue_length" in render(client, None)
    assert int(client.info("server")["tcp_port"]) == fleet.primary_port()
