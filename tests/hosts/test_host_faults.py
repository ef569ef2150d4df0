"""A fleet across hosts (network namespaces: tests/support/netns.py) that loses one of them.

The rig (tests/support/hosts_rig.py): producers on ``prod``, workers on ``work1`` and
``work2``, Redis on ``redis1`` with a replica on ``redis2``, every link over
``rediss://`` with a CA the rig made. A stream of single writes and a batch run while
a worker host vanishes (its link down, then every process SIGKILLed: the rest keep
half-open connections to it) and while a worker host is cut off mid-write and healed.
Promises: nothing lost, no write run twice per request id, a new invocation served
within the recovery time, and the work caught by the fault finished within the bound
docs/guarantees.md states (a write that was running on a lost host is answered once
its claim's deadline has passed).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.hosts_faults import Fleet, lose_host, partition_host
from tests.support.hosts_rig import HostsRig, Layout, rig_with_workers

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

#: CLEVERAGENTS_RECOVERY_S of the rig's fleet.
RECOVERY_S = 4.0
#: Each request's timeout: a write caught running on a lost host holds its claim for this
#: plus the claim's grace (CLAIM_GRACE_S, 30 s), and is then answered write_interrupted.
TIMEOUT_S = 3.0
#: Slack over a bound, for a machine of 2 busy cores.
SLACK_S = 6.0
#: Slack over a drain's bound: the caught work (a batch's chunks, 50 to 80 lines) is
#: served by the host left, whose pool processes wait on the caught writes' claims
#: first, on two cores shared with two other test processes in CI (a lost host's drain
#: took 50.3 s there against a bound of 37 s before slack, and 52.1 s in a clean-clone
#: CI run with a Sentinel test running beside it).
DRAIN_SLACK_S = 20.0


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostsRig]:
    yield from rig_with_workers(tmp_path_factory, Layout(tls=True, recovery_s=RECOVERY_S))


def _load(rig: HostsRig, name: str) -> Fleet:
    fleet = Fleet(rig, name)
    # Two thirds of what one worker host serves: the fleet keeps up with one host down
    fleet.start_load(120, rate=2, slow=0.3, batch_lines=80, batch_every=600, chunk=10,
                     timeout_s=TIMEOUT_S)
    return fleet


def test_a_lost_worker_host_loses_nothing_and_runs_no_write_twice(rig: HostsRig) -> None:
    # Given load on both worker hosts, and work2 running a write
    fleet = _load(rig, "lost")
    victim = rig.host("work2")
    assert fleet.writing_on(victim), "no write ran on work2"
    # When work2 vanishes: link down, every process killed, no FIN or RST sent
    record = fleet.fault("work2 lost", lose_host(victim), victim=victim)
    fleet.stop_load()
    tally = fleet.tally()
    # Then nothing is lost and no write ran twice
    assert record.during_write, "no write was running on work2 when it was lost"
    assert tally.lost == 0, tally
    assert tally.duplicate_writes == 0, tally
    assert tally.batches == 1, tally
    assert tally.batches_broken == 0, tally
    assert tally.sent > 20, tally
    # And a new invocation was served within the recovery time; what the host held came
    # back, its running write answered once its claim's deadline passed
    assert record.probe_s < RECOVERY_S + SLACK_S, record
    assert record.drain_s < RECOVERY_S + TIMEOUT_S + 30 + DRAIN_SLACK_S, record
    assert set(tally.failures) <= {"tool_execution_failure/write_interrupted"}, tally
    # (the host comes back, with a worker, for the next test)
    victim.revive()
    rig.start_worker("work2")


def test_a_partitioned_worker_host_runs_no_write_twice_and_catches_up(rig: HostsRig) -> None:
    # Given load on both worker hosts, and work1 running a write
    fleet = _load(rig, "cut")
    victim = rig.host("work1")
    assert fleet.writing_on(victim), "no write ran on work1"
    # When work1 is cut off for 10 s mid-write, then healed
    record = fleet.fault("work1 partitioned 10 s", partition_host(victim, 10), victim=victim)
    fleet.stop_load()
    tally = fleet.tally()
    # Then nothing is lost and no write ran twice (its message went to work2, which
    # waited on the claim of the run that went on behind the partition)
    assert record.during_write, "no write was running on work1 when it was cut off"
    assert tally.lost == 0, tally
    assert tally.duplicate_writes == 0, tally
    assert tally.batches == 1, tally
    assert tally.batches_broken == 0, tally
    # And work2 served new invocations within the recovery time; the caught work ended
    # within the partition's length plus the recovery time
    assert record.probe_s < RECOVERY_S + SLACK_S, record
    assert record.drain_s < 10 + RECOVERY_S + DRAIN_SLACK_S, record
