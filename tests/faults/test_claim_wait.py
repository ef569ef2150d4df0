"""A write whose first run goes on elsewhere does not hold a pool process while it waits.

A delivery that finds its write claimed by a run that may still go on (on a host lost
or cut off, or a tool outliving its message's time) waits for that run's result. It
waited in the pool process, polling the claim: a host left with as many such waits as
pool processes served nothing new until they ended (the partition's length, or the
timeout plus 30 s). Now it goes back to the broker and asks again every second.

A real worker with one pool process on the test Redis; the claim of a run on another
machine is written as that machine's worker would have.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from cleveragents.client import SkillClient
from cleveragents.constants import FIRST_RUN_POLL_S
from cleveragents.stores import Claim
from cleveragents.stores.redis import RedisGuardStore
from tests.support.procs import Worker, wait_until
from tests.support.worker_runs import received_in

pytestmark = pytest.mark.timeout(120)

SKILL, WRITE, READ = "test/faults", "test/write-once", "test/read"
#: Seconds the other machine's claim is trusted: longer than a read may take here.
DEADLINE_S = 12.0
#: Seconds a read may take while the write waits: one pool process, a busy machine.
SERVED_WITHIN_S = 5.0


def test_a_read_is_served_while_a_write_waits_for_its_first_run_elsewhere(
    redis_url: str, client: SkillClient, start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    # Given a write claimed by a run on another machine, trusted for 12 s more
    guard = RedisGuardStore(redis.Redis.from_url(redis_url), ttl_s=600)
    assert guard.claim("w-far", Claim("another-host", 1, time.time() + DEADLINE_S)) is None
    worker = start_worker(redis_url, concurrency=1)
    ledger = tmp_path / "ledger"
    # When it is delivered to a worker of one pool process, and a read is sent after it
    write = client.submit(SKILL, WRITE, {"path": str(ledger), "key": "w-far"},
                          allow_writes=True, request_id="w-far")
    wait_until(lambda: received_in(worker.log_text(), "w-far") >= 1, 30, "the write taken")
    sent = time.monotonic()
    read = client.submit(SKILL, READ, {"path": str(tmp_path / "reads"), "key": "r"})
    # Then the read is served at once: no process waits on the other machine's run
    assert read.result(timeout=60).success
    served_s = time.monotonic() - sent
    print(f"the read was served {served_s:.2f} s after it was sent")
    assert served_s < SERVED_WITHIN_S
    # And the write, once that run's deadline passed, says it may have happened, unrun
    result = write.result(timeout=60)
    assert result.error is not None
    assert result.error.details.get("reason") == "write_interrupted", result.error
    assert not ledger.exists()
    # And it asked again about once a second, not in a loop (its delay kept by the
    # worker's admission, which drops any other a message carries)
    asked = received_in(worker.log_text(), "w-far")
    assert 2 <= asked <= DEADLINE_S / FIRST_RUN_POLL_S + 5, asked
