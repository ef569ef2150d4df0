"""Rows of the fault table for hostile tools (issue 12), each on a real worker and Redis.

The tools are those of tests/faults/test_hostile_tools.py. In these rows ``failed`` counts
outcomes other than the expected one (every tool here must end as a failure of a
given reason, or, for the escaping tool that exits, as a success); ``recover s``
is submit to the last result (and, where the row says, to the worker serving
again on every pool process).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from cleveragents.client import SkillClient
from cleveragents.skills import SkillResult
from tests.conftest import worker_env
from tests.faults.test_hostile_tools import CONTROL, HOSTILE_SKILLS, SECRET, SKILL
from tests.support.fault_rig import Outcome, Rig, reason
from tests.support.procs import Worker, wait_until

Scenario = Callable[[Rig], Outcome]


def _worker(r: Rig, **env: str) -> tuple[Worker, SkillClient]:
    settings = worker_env(
        r.url,
        CLEVERAGENTS_CATALOGUE=str(HOSTILE_SKILLS),
        CLEVERAGENTS_HOME=str(r.root / "home"),
        **env,
    )
    worker = Worker(settings, concurrency=2)
    r.workers.append(worker)  # the rig kills it by PID at the end
    return worker.start(), r.client()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


def _serves_both(client: SkillClient) -> bool:
    """Two 1 s tools at once finish on two pool processes within 2.5 s."""
    started = time.monotonic()
    pair = [client.submit(SKILL, "test/pool-pid", {"seconds": 1.0}) for _ in range(2)]
    results = [h.result(timeout=60) for h in pair]
    pids = {r.output_data["pid"] for r in results if r.success}
    return len(pids) == 2 and time.monotonic() - started < 2.5


def _timeouts(tool: str, note: str) -> Scenario:
    def scenario(r: Rig) -> Outcome:
        worker, client = _worker(r)
        before = worker.child_pids()
        outcome = Outcome(note, 2)
        started = time.monotonic()
        handles = [client.submit(SKILL, tool) for _ in range(2)]  # one per pool process
        results = [h.result(timeout=120) for h in handles]
        outcome.failed = sum(reason(x) != "timeout" for x in results)
        outcome.notes.append(f"result after {time.monotonic() - started:.1f}s")
        wait_until(lambda: set(worker.child_pids()).isdisjoint(before), 30, "new pool processes")
        outcome.recover_s = time.monotonic() - started
        outcome.notes.append("pools replaced" if worker.alive() else "WORKER DIED")
        if not _serves_both(client):
            outcome.notes.append("not served on both pool processes afterwards")
        return outcome

    return scenario


def escaping_grandchildren(r: Rig) -> Outcome:
    """One tool exits, one hangs; each leaves a grandchild in its own session."""
    _, client = _worker(r)
    shared = Path(tempfile.mkdtemp(prefix="fault-table-escape-"))
    shared.chmod(0o1777)
    try:
        started = time.monotonic()
        files = [shared / "done.pid", shared / "hung.pid"]
        handles = [
            client.submit(SKILL, "test/escape", {"pid_file": str(f), "hang": f.stem == "hung"})
            for f in files
        ]
        done, hung = (h.result(timeout=60) for h in handles)
        outcome = Outcome("escaping grandchild, one tool exits, one hangs", 2)
        outcome.failed = int(not done.success) + int(reason(hung) != "timeout")
        left = sum(_alive(int(f.read_text())) for f in files if f.exists())
        outcome.notes.append(f"grandchildren alive after the results: {left}")
        both = _serves_both(client)
        outcome.recover_s = time.monotonic() - started
        if not both:
            outcome.notes.append("pool processes not free at once afterwards")
        return outcome
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def snooping(r: Rig) -> Outcome:
    """A command tool reads every /proc/*/environ it can; the worker holds a secret."""
    _, client = _worker(
        r, CLEVERAGENTS_PLANTED_SECRET=SECRET, CLEVERAGENTS_SNOOP_CONTROL=CONTROL
    )
    started = time.monotonic()
    result = client.submit(SKILL, "test/snoop", {"needles": [SECRET, CONTROL]}).result(
        timeout=60
    )
    outcome = Outcome("command tool snoops on /proc/*/environ", 1)
    outcome.recover_s = time.monotonic() - started
    if not result.success:
        outcome.failed = 1
        return outcome
    seen: dict[str, Any] = dict(result.output_data)
    outcome.failed = int(bool(seen["found"][SECRET]) or not seen["found"][CONTROL])
    outcome.notes.append(
        f"uid {seen['uid']}, {seen['readable']} environs readable, "
        f"secret in {len(seen['found'][SECRET])}"
    )
    return outcome


def floods(r: Rig) -> Outcome:
    """12 MB of output from a command tool and from a python tool (limit 10 MB)."""
    _, client = _worker(r)
    started = time.monotonic()
    tools = ("test/flood", "test/python-flood")
    handles = [client.submit(SKILL, tool, {"size": 12_000_000}) for tool in tools]
    results: list[SkillResult] = [h.result(timeout=120) for h in handles]
    outcome = Outcome("12 MB output, command and python (limit 10 MB)", 2)
    outcome.recover_s = time.monotonic() - started
    outcome.failed = sum(reason(x) != "output_too_large" for x in results)
    with redis.Redis.from_url(r.url) as store:
        sizes = [int(store.strlen(f"celery-task-meta-{h.request_id}")) for h in handles]
    outcome.notes.append(f"largest stored result {max(sizes)} bytes")
    return outcome


def rows(visibility_s: float) -> list[tuple[str, float, Scenario]]:
    """(name, visibility timeout, scenario) for each hostile-tool row."""
    return [
        (
            "7 python tool swallows its time-out (x2)",
            visibility_s,
            _timeouts("test/swallow-forever", "python tool swallows its time-out, x2"),
        ),
        (
            "7 python tool blocks SIGALRM, hard limit (x2)",
            visibility_s,
            _timeouts("test/unstoppable", "python tool blocks SIGALRM, x2"),
        ),
        ("8 escaping grandchild (exits, hangs)", visibility_s, escaping_grandchildren),
        ("9 command tool snoops on /proc/*/environ", visibility_s, snooping),
        ("10 12 MB output (command, python)", visibility_s, floods),
    ]
