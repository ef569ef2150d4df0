"""A paused process does not blame its tool: a deadline counts the tool's running time.

Each case runs a deadline in a child process, which the test stops (``SIGSTOP``) for
longer than the timeout and then lets go on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support.procs import REPO

pytestmark = pytest.mark.timeout(60)

#: Runs ``work`` (sleep argv[2] s in steps, as a tool) under a deadline of argv[3] s, in
#: the main thread or another one (argv[1]); prints "working" as it starts, then "ran" or
#: "timed out".
_CHILD = """
import sys, threading, time
from cleveragents.runtime.deadline import ToolTimeout, call_with_deadline
where, busy, timeout = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])

def work():
    print("working", flush=True)
    end = time.monotonic() + busy
    while time.monotonic() < end:
        time.sleep(0.05)

def run():
    try:
        call_with_deadline(work, timeout)
        print("ran", flush=True)
    except ToolTimeout:
        print("timed out", flush=True)

print("started", flush=True)
if where == "main":
    run()
else:
    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
"""


def _run(where: str, busy_s: float, timeout_s: float, pause_s: float) -> str:
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, where, str(busy_s), str(timeout_s)],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "started"
    assert child.stdout.readline().strip() == "working"  # the tool runs, under its deadline
    if pause_s:
        os.kill(child.pid, signal.SIGSTOP)
        time.sleep(pause_s)  # the pause itself, the scenario's length: not a wait for an event
        os.kill(child.pid, signal.SIGCONT)
    out, _ = child.communicate(timeout=30)
    return out.strip()


@pytest.mark.parametrize("where", ["main", "thread"])
def test_a_pause_of_the_process_does_not_count_against_the_tool(where: str) -> None:
    # A tool that runs 1.5 s of its 3 s, in a process stopped for 4 s meanwhile
    assert _run(where, busy_s=1.5, timeout_s=3, pause_s=4) == "ran"


@pytest.mark.parametrize("where", ["main", "thread"])
def test_a_tool_that_runs_past_its_timeout_is_still_stopped(where: str) -> None:
    assert _run(where, busy_s=4, timeout_s=1.5, pause_s=0) == "timed out"
    # And a pause does not give it more than the pause: 2 s of work after it, of 3 s
    assert _run(where, busy_s=30, timeout_s=3, pause_s=3) == "timed out"
