"""`cleveragents submit --wait` as the documented ``producer`` Redis user (issue 42, item 7).

The producer's user may not use remote control (docs/deployment.md), so the CLI's check
for a queue no worker serves, asked once the result takes longer than ``QUEUE_CHECK_S``,
cannot be answered: it says nothing, and the wait goes on to the result.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from cleveragents.cli.submit_cmd import QUEUE_CHECK_S
from tests.support.acl_roles import compose_worker
from tests.support.composefile import RedisWithUsers, _program, _subprocess_env

pytestmark = pytest.mark.timeout(240)


def test_submit_wait_as_the_producer_user_outlasts_the_queue_check(
    server: RedisWithUsers, tmp_path: Path
) -> None:
    # Given a worker of the compose file and a tool that takes longer than the CLI waits
    # before it asks which workers serve the queue
    tally = tmp_path / "tally.txt"
    sleep_s = QUEUE_CHECK_S + 2.0
    with compose_worker(server, "worker", tmp_path / "w"):
        # When the producer's user submits and waits
        env = {
            **_subprocess_env("worker", tmp_path),
            "CLEVERAGENTS_BROKER_URL": server.url("producer"),
        }
        args = {"path": str(tally), "key": "k1", "sleep_s": sleep_s}
        done = subprocess.run(
            [*_program(["cleveragents"]), "submit", "test/batch", "test/tally",
             "--args", json.dumps(args), "--wait", "--json"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    # Then the refused remote-control call says nothing and the result is printed
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr
    result = json.loads(done.stdout)
    assert result["success"] is True, result
    assert tally.read_text().splitlines() == ["k1"]
    # and Redis did refuse the producer's remote control (the call was made)
    assert any("pidbox" in d.get("object", "") for d in server.denials()), server.denials()
