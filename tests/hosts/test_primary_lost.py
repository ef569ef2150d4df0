"""The Redis primary's host lost, on a fleet that finds Redis through Sentinel.

The rig's ``sentinel`` topology (tests/support/hosts_rig.py) with TLS: producers on
``prod``, workers on ``work1`` and ``work2``, the Redis primary on ``redis1`` and its
replica on ``redis2``, three Sentinels on ``redis1``, ``redis2`` and ``prod`` (quorum
2); servers, replication and Sentinels speak TLS only, and every producer and worker is
given the Sentinels' ``sentinel://`` URLs with the rig's CA, never a server's address.
A stream of single writes and a batch run while ``redis1`` vanishes whole (link down,
its Redis and its Sentinel SIGKILLed). Promises: the two Sentinels left promote the
replica, producers and workers follow it by themselves, nothing is lost, no write runs
twice, and a new invocation is served within CLEVERAGENTS_RECOVERY_S of the failover
(and a watch's pace: every process cuts its connections to the lost primary once the
Sentinels name the new one, ``sentinel_follow.py``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cleveragents.broker.redis.sentinel_follow import SENTINEL_TIMEOUT_S, WATCH_S
from tests.support.hosts_faults import Fleet, PrimaryLoss
from tests.support.hosts_rig import HostsRig, Layout, rig_with_workers

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

#: CLEVERAGENTS_RECOVERY_S of the rig's fleet.
RECOVERY_S = 4.0
#: Each request's timeout (a write's claim is held this plus 30 s at most).
TIMEOUT_S = 3.0
#: Slack over a bound, for a machine of 2 busy cores.
SLACK_S = 6.0


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostsRig]:
    layout = Layout(topology="sentinel", tls=True, recovery_s=RECOVERY_S)
    yield from rig_with_workers(tmp_path_factory, layout)


def test_the_primary_host_lost_is_followed_to_the_replica_losing_nothing(rig: HostsRig) -> None:
    # Given load on both worker hosts through the Sentinels, and results stored already
    fleet = Fleet(rig, "primary")
    fleet.start_load(60, rate=2, slow=0.3, batch_lines=60, batch_every=600, chunk=10,
                     timeout_s=TIMEOUT_S)
    assert fleet.writing_on(rig.host("work1"), 20) or fleet.writing_on(rig.host("work2"), 20)
    assert rig.primary().name == "redis1"
    # When the primary's host vanishes (its Sentinel with it)
    loss = PrimaryLoss(rig)
    record = fleet.fault("redis1 lost", loss, victim=None)
    fleet.stop_load()
    tally = fleet.tally()
    # Then the replica is the primary, and nothing is lost and no write ran twice
    assert rig.primary(skip="redis1").name == "redis2"
    assert tally.lost == 0, tally
    assert tally.duplicate_writes == 0, tally
    assert tally.batches == 1, tally
    assert tally.batches_broken == 0, tally
    assert tally.sent > 20, tally
    # And producers and workers followed it by themselves: a new invocation was served
    # within a watch's pace and a Sentinel's time-out of the failover, plus the recovery
    # time (every process cuts its connections to the lost primary as soon as the
    # Sentinels name the new one: cleveragents/broker/redis/sentinel_follow.py; before
    # that, each half-open pooled connection a process met cost HALF_OPEN_S, 14 to 60 s);
    # what the fault caught ended by its claims' deadlines at most (a worker whose
    # heartbeat went to the lost primary looks dead: its write is answered
    # write_interrupted, never run twice)
    print(record, tally)  # the figures, shown with -rP
    follow_s = record.failover_s + WATCH_S + SENTINEL_TIMEOUT_S + RECOVERY_S
    assert record.probe_s < follow_s + SLACK_S, record
    assert record.drain_s < follow_s + TIMEOUT_S + 30 + SLACK_S, record
    assert all(w.alive() for w in rig.workers), "a worker exited"
