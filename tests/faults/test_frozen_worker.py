"""A worker frozen while its tool runs does not blame the tool for its own pause.

Worker A runs a read; it is stopped whole (``SIGSTOP`` of its process group) for
longer than the read's timeout and its hard time limit; the broker hands the read to
worker B, which finishes it. When A goes on, its tool's deadline and its hard limit
move on by the pause (``cleveragents/runtime/pauses.py``): no time-out is reported,
B's result stands, and A's log says its own delivery was dropped.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cleveragents.constants import HARD_LIMIT_GRACE_S
from tests.support.fault_rig import READ, Rig, request, rig
from tests.support.procs import wait_until

pytestmark = pytest.mark.timeout(150)

TIMEOUT_S = 4.0
#: Longer than the read's timeout and its hard limit together.
FROZEN_S = TIMEOUT_S + HARD_LIMIT_GRACE_S + 4


@pytest.fixture(params=["redis", "rabbitmq"])
def frozen_rig(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Rig]:
    broker = request.getfixturevalue("rabbit_url") if request.param == "rabbitmq" else None
    with rig(tmp_path / "rig", broker=broker, recovery_s=4.0) as made:
        yield made


def test_a_frozen_worker_lets_the_other_workers_result_stand(frozen_rig: Rig) -> None:
    r = frozen_rig
    first = r.start_worker(concurrency=1)
    client = r.client()
    key = f"frozen-{os.urandom(3).hex()}"
    body = request(READ, key, r.records.path, sleep_s=2.5, first_only=True)
    request_id = client.submit(
        client.build_request(body["skill"], body["tool"], body["arguments"], request_id=key,
                             timeout_s=TIMEOUT_S)
    ).request_id  # fmt: skip
    wait_until(lambda: r.records.counts()[key] == 1, 30, "the read to start on A")
    second = r.start_worker(concurrency=1)
    # When A is frozen whole, past the read's timeout and hard limit
    assert first.proc is not None
    os.killpg(first.proc.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        result = client.wait(request_id, timeout=FROZEN_S)
        recovered_s = time.monotonic() - stopped
        # A frozen whole for FROZEN_S, the scenario's length: not a wait for an event
        time.sleep(max(0.0, FROZEN_S - (time.monotonic() - stopped)))
    finally:
        os.killpg(first.proc.pid, signal.SIGCONT)
    print(f"B's result {recovered_s:.1f} s after A froze (recovery time {r.recovery_s:g} s)")
    # Then B ran it (the read's rerun ends at once) within the recovery time
    assert result.success, result.error
    assert r.records.counts()[key] == 2
    assert r.records.pids(key)[1] != r.records.pids(key)[0]
    # And once A goes on, it says its delivery was dropped, and blames no tool
    said = f"{key} was finished by another worker while this one was paused"
    wait_until(lambda: said in first.log.read_text(encoding="utf-8"), 30, "A to say so")
    log = first.log.read_text(encoding="utf-8")
    assert "timed out" not in log, log[-3000:]
    assert "Hard time limit" not in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    # B's result stands
    assert client.wait(request_id, timeout=5).success
    assert second.proc is not None
    assert second.proc.poll() is None
    assert recovered_s < 4.0 + 6, recovered_s  # the recovery time, and B's start-up
