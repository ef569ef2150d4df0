"""Fault scenarios: each returns what it measured (test_faults asserts, fault_table tabulates)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from typing import Any

from tests.support.fault_rig import (
    POISON,
    READ,
    WRITE,
    BatchThread,
    CuttingProxy,
    Outcome,
    Rig,
    mixed_requests,
    reason,
    request,
    served,
    stored_results,
    submit,
    tally,
    wait_results,
)
from tests.support.procs import Worker, kill_group, wait_until
from tests.support.worker_runs import answered, deliveries

# --------------------------------------------------------------------------- scenarios


def scenario_child_kill_mid_tool(r: Rig, *, tools: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """One invocation of each tool; each one's pool process is SIGKILLed while its tool sleeps.

    Returns, per tool: the result the producer saw, the stored one, the pids that ran
    the tool (the first one was killed), and the seconds from the kills to all results.
    """
    worker = r.start_worker(concurrency=len(tools))
    client = r.client()
    path = r.records.path
    keys = {tool: f"kill-{tool.split('/')[1]}-{os.urandom(3).hex()}" for tool in tools}
    for tool, key in keys.items():
        submit(client, request(tool, key, path, sleep_s=30, first_only=True))
    wait_until(lambda: set(keys.values()) <= set(r.records.counts()), 30, "every tool to start")
    victims = {tool: r.records.pids(key)[0] for tool, key in keys.items()}
    children = set(worker.child_pids())
    assert set(victims.values()) <= children, (victims, children)
    killed_at = time.monotonic()
    for pid in victims.values():
        os.kill(pid, signal.SIGKILL)
    results = {tool: client.wait(key, timeout=30) for tool, key in keys.items()}
    recover_s = time.monotonic() - killed_at
    return {
        tool: {
            "result": results[tool],
            "stored": client.get(key),
            "pids": r.records.pids(key),
            "killed": victims[tool],
            "recover_s": recover_s,
        }
        for tool, key in keys.items()
    }


def scenario_child_kills_under_load(
    r: Rig,
    n: int,
    *,
    kills: int,
    sleep_s: float = 0.05,
    concurrency: int = 2,
    deadline_s: float = 90.0,
) -> Outcome:
    """``n`` single invocations; the pool process running one is SIGKILLed ``kills`` times.

    recover_s: from the last kill to the last result stored.
    """
    worker = r.start_worker(concurrency=concurrency)
    client = r.client()
    path = r.records.path
    requests = mixed_requests(n, path, sleep_s=sleep_s, prefix="ck")
    ids = [submit(client, body) for body in requests]
    last_kill = time.monotonic()
    for k in range(kills):
        # Kill the process that runs the latest recorded execution, while it sleeps in the tool.
        wait_until(lambda k=k: len(r.records.lines()) > (k + 1) * n // (kills + 2), 60, "progress")
        pid = r.records.lines()[-1][1]
        if pid in worker.child_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            last_kill = time.monotonic()
    results = wait_results(client, ids, deadline_s)
    outcome = tally(Outcome("child SIGKILL mid-tool", n), requests, results, r.records)
    if not outcome.lost:
        outcome.recover_s = time.monotonic() - last_kill
    return outcome


def wait_for_moment(r: Rig, worker: Worker, n: int, batch: BatchThread, moment: str) -> None:
    """Wait until ~30% of the batch is stored, then (``moment="busy"``) until every pool
    process of ``worker`` is inside a tool it started within the last 25 ms.

    "busy" is the chosen moment for a kill: with every process running a message
    (prefetch full) the worker has no fetch (BRPOP) in flight, whose message a kill
    could catch between Redis and the worker. "any" is whatever moment 30% falls on.
    """
    wait_until(lambda: r.stored() >= n * 0.3 or not batch.thread.is_alive(), 60, "30% done")
    if moment == "busy":
        children = worker.child_pids()
        wait_until(
            lambda: r.records.busy(children, 0.025) or not batch.thread.is_alive(),
            30,
            "every pool process inside a tool",
            interval=0.002,
        )


def scenario_worker_kill(
    r: Rig,
    n: int,
    *,
    restart_after_s: float,
    moment: str = "busy",
    sleep_s: float = 0.05,
    chunk_size: int = 25,
    deadline_s: float = 60.0,
) -> Outcome:
    """A batch (``run_many``) whose worker's whole process group is SIGKILLed mid-batch.

    A new worker starts ``restart_after_s`` after the kill. recover_s: from that start
    to the batch's end (every result yielded).
    """
    worker = r.start_worker(concurrency=2)
    client = r.client()
    requests = mixed_requests(n, r.records.path, sleep_s=sleep_s, prefix="wk")
    batch = BatchThread(client, requests, chunk_size).start()
    wait_for_moment(r, worker, n, batch, moment)
    assert worker.proc is not None
    kill_group(worker.proc)
    worker.proc.wait(10)
    killed = time.monotonic()
    # The scenario's own pause, not a wait for an event: the worker is down this long
    time.sleep(max(0.0, killed + restart_after_s - time.monotonic()))
    restarted = time.monotonic()
    r.start_worker(concurrency=2)
    ended = batch.join(deadline_s)
    finished = time.monotonic()
    ids = [body["request_id"] for body in requests]
    outcome = tally(
        Outcome(f"worker SIGKILL mid-batch ({moment})", n),
        requests,
        stored_results(client, ids),
        r.records,
    )
    outcome.client_error = batch.describe_error()
    if ended and batch.error is None and len(batch.results) == n:
        outcome.recover_s = finished - restarted
    else:
        outcome.notes.append(f"run_many ended={ended}, yielded {len(batch.results)}/{n}")
    return outcome


def scenario_redis_restart(
    r: Rig,
    n: int,
    *,
    down_s: float,
    moment: str = "busy",
    sig: int = signal.SIGKILL,
    sleep_s: float = 0.05,
    chunk_size: int = 25,
    deadline_s: float = 60.0,
) -> Outcome:
    """A batch (``run_many``); redis-server is killed mid-batch and started ``down_s`` later.

    The workers' side is judged by the store (polled until every result is there);
    the producer's by whether ``run_many`` itself came through (``client_error``).
    recover_s: from redis-server's restart to every result stored.
    """
    worker = r.start_worker(concurrency=2)
    client = r.client()
    requests = mixed_requests(n, r.records.path, sleep_s=sleep_s, prefix="rr")
    ids = [body["request_id"] for body in requests]
    batch = BatchThread(client, requests, chunk_size).start()
    wait_for_moment(r, worker, n, batch, moment)
    r.stop_redis(sig)
    time.sleep(down_s)  # the outage itself, the scenario's length: not a wait for an event
    r.start_redis()
    restarted = time.monotonic()
    results = wait_results(client, ids, deadline_s)
    finished = time.monotonic()
    outcome = tally(
        Outcome(f"redis restart mid-batch ({down_s:g}s down, {moment})", n),
        requests,
        results,
        r.records,
    )
    if not worker.alive():
        outcome.notes.append("the worker process exited")
    if not outcome.lost:
        outcome.recover_s = finished - restarted
    ended = batch.join(10)
    outcome.client_error = batch.describe_error()
    if not ended or len(batch.results) != n:
        outcome.notes.append(f"run_many ended={ended}, yielded {len(batch.results)}/{n}")
    return outcome


def scenario_redis_outage(
    r: Rig, *, down_s: float, busy: bool, n: int = 5, deadline_s: float = 30.0
) -> Outcome:
    """redis-server stopped for ``down_s`` while a worker is idle (or running an invocation).

    Afterwards ``n`` new reads are submitted. recover_s: from redis-server's restart to
    all of them (and the one that was running) stored.
    """
    worker = r.start_worker(concurrency=2)
    client = r.client()
    path = r.records.path
    assert served(client, path, "warm-up", 30)
    ids: list[str] = []
    if busy:
        ids.append(submit(client, request(READ, "running", path, sleep_s=2)))
        wait_until(lambda: r.records.counts()["running"] > 0, 10, "the invocation to start")
    else:
        wait_until(r.quiet, 10, "the warm-up acknowledged: nothing in flight")
    r.stop_redis(signal.SIGTERM)
    time.sleep(down_s)  # the outage itself, the scenario's length: not a wait for an event
    r.start_redis()
    restarted = time.monotonic()
    after = [request(READ, f"after-{i}", path) for i in range(n)]
    ids += [submit(client, body) for body in after]
    results = wait_results(client, ids, deadline_s)
    outcome = tally(
        Outcome(f"redis down {down_s:g}s, worker {'busy' if busy else 'idle'}", len(ids)),
        after + ([request(READ, "running", path)] if busy else []),
        results,
        r.records,
    )
    if not outcome.lost:
        outcome.recover_s = time.monotonic() - restarted
    if not worker.alive():
        outcome.notes.append("the worker process exited")
    if "Unrecoverable error" in worker.log_text():
        outcome.notes.append("worker log: Unrecoverable error")
    return outcome


def scenario_reply_lost_in_flight(r: Rig, *, wait_s: float) -> dict[str, Any]:
    """The connection that fetches an invocation breaks just as Redis hands it over.

    The worker talks to Redis through a ``CuttingProxy`` that cuts the connection
    carrying the BRPOP reply with the invocation (its request id is in the message
    headers). Returns whether a result was stored within ``wait_s`` seconds, and
    whether the worker still serves new invocations.
    """
    proxy = CuttingProxy(r.redis.port)
    try:
        worker = r.start_worker(concurrency=2, url=proxy.url)
        client = r.client()
        path = r.records.path
        assert served(client, path, "before-cut", 30)
        key = f"in-flight-{os.urandom(3).hex()}"
        proxy.arm(key)
        submit(client, request(READ, key, path))
        wait_until(proxy.cut.is_set, 10, "the reply to be cut")
        result = wait_results(client, [key], wait_s)[key]
        return {
            "result": result,
            "runs": r.records.counts()[key],
            "served_after": served(client, path, "after-cut", 30),
            "worker_alive": worker.alive(),
        }
    finally:
        proxy.close()


def settled(r: Rig, request_id: str, workers: Iterable[Worker] | None = None) -> bool:
    """Nothing of ``request_id`` is left to happen: every delivery ``workers`` (by default
    the rig's) received is answered, and nothing waits or is handed out (``Rig.quiet``)."""
    chosen = list(r.workers if workers is None else workers)
    return answered(chosen, request_id) == deliveries(chosen, request_id) and r.quiet()


def scenario_duplicate_submission(
    r: Rig, *, copies: int, sleep_s: float, concurrency: int
) -> dict[str, Any]:
    """A slow non-idempotent write submitted ``copies`` times (one request id) while it runs."""
    r.start_worker(concurrency=concurrency)
    client = r.client()
    key = f"dup-{os.urandom(3).hex()}"
    body = request(WRITE, key, r.records.path, sleep_s=sleep_s)
    submit(client, body)
    wait_until(lambda: r.records.counts()[key] > 0, 20, "the write to start")
    for _ in range(copies - 1):
        submit(client, body)
    first_seen = client.wait(key, timeout=sleep_s + 30)
    wait_until(
        lambda: deliveries(r.workers, key) >= copies, sleep_s * copies + 30, "every delivery"
    )
    wait_until(lambda: settled(r, key), 30, "every delivery answered")
    return {
        "first_seen": first_seen,
        "final": client.get(key),
        "runs": r.records.counts()[key],
        "deliveries": deliveries(r.workers, key),
    }


def scenario_outlive_visibility(r: Rig, *, sleep_s: float) -> dict[str, Any]:
    """A non-idempotent write that sleeps past the visibility timeout, on a live worker.

    Worker A (one process) runs it. Once the visibility timeout has passed, worker B
    starts, whose start-up sweep would hand the still-unacknowledged message out again
    (to B, as A's only process is busy) if A did not hold it alive: with kombu's own
    transport it did.
    """
    assert r.visibility_s is not None, "a visibility timeout to outlive"
    r.start_worker(concurrency=1)
    client = r.client()
    key = f"slow-{os.urandom(3).hex()}"
    submit(client, request(WRITE, key, r.records.path, sleep_s=sleep_s))
    wait_until(lambda: r.records.counts()[key] > 0, 20, "the write to start")
    # The clock under test, not an event: the visibility timeout must have passed
    time.sleep(r.visibility_s + 0.5)
    r.start_worker(concurrency=1)
    result = client.wait(key, timeout=sleep_s + 30)
    # Acknowledged and answered: nothing is left that could be handed out again
    wait_until(lambda: settled(r, key), 30, "every delivery answered")
    return {
        "result": result,
        "final": client.get(key),
        "runs": r.records.counts()[key],
        "deliveries": deliveries(r.workers, key),
        "counted": r.attempts(key),
    }


def scenario_poison(r: Rig, *, concurrency: int = 2) -> dict[str, Any]:
    """One invocation whose tool SIGKILLs its own process every time it runs."""
    worker = r.start_worker(concurrency=concurrency)
    client = r.client()
    key = f"poison-{os.urandom(3).hex()}"
    started = time.monotonic()
    submit(client, request(POISON, key, r.records.path))
    result = client.wait(key, timeout=60)
    elapsed = time.monotonic() - started
    # A read sent after it is served first: the worker has moved past the poison (whose
    # runs and dead letter come before its result anyway)
    served_after = served(client, r.records.path, "after-poison", 30)
    return {
        "result": result,
        "runs": r.records.counts()[key],
        "elapsed_s": elapsed,
        "served_after": served_after,
        "worker_alive": worker.alive(),
        "dead_letters": r.dead_letters(),
    }


def scenario_poison_in_batch(
    r: Rig, n: int, *, poisons: int = 1, chunk_size: int = 500, deadline_s: float = 60.0
) -> Outcome:
    """A batch whose chunks hold poison invocations among reads and writes.

    recover_s: the batch's duration (every result yielded).
    """
    worker = r.start_worker(concurrency=2)
    client = r.client()
    path = r.records.path
    requests = mixed_requests(n - poisons, path, sleep_s=0.0, prefix="pb")
    step = max(1, len(requests) // (poisons + 1))
    for p in range(poisons):
        requests.insert((p + 1) * step + p, request(POISON, f"pb-poison-{p}", path))
    started = time.monotonic()
    batch = BatchThread(client, requests, chunk_size).start()
    ended = batch.join(deadline_s)
    elapsed = time.monotonic() - started
    ids = [body["request_id"] for body in requests]
    results = stored_results(client, ids)
    outcome = tally(Outcome("poison in a batch chunk", len(requests)), requests, results, r.records)
    outcome.client_error = batch.describe_error()
    counts = r.records.counts()
    for p in range(poisons):
        rid = f"pb-poison-{p}"
        outcome.notes.append(f"{rid}: ran {counts[rid]}x, reason {reason(results.get(rid))}")
    if ended and len(batch.results) == len(requests):
        outcome.recover_s = elapsed
    if not served(client, path, "after-batch-poison", 30):
        outcome.notes.append("not served afterwards")
    if not worker.alive():
        outcome.notes.append("the worker process exited")
    return outcome


def scenario_dead_worker(
    r: Rig, *, tools: tuple[str, ...], sleep_s: float = 30.0, deadline_s: float = 60.0
) -> dict[str, Any]:
    """A worker running one long invocation of each tool is SIGKILLed whole; a new one starts.

    Each tool sleeps ``sleep_s`` on its first run only, so a rerun ends at once. The new
    worker starts right after the kill. Returns, per tool: its stored result, the pids
    that ran it and the deliveries the guard counted; the new worker's pool processes;
    and ``recover_s``, from the kill to every result stored (None when some were still
    missing after ``deadline_s``).
    """
    first = r.start_worker(concurrency=len(tools))
    client = r.client()
    path = r.records.path
    keys = {tool: f"dead-{tool.split('/')[1]}-{os.urandom(3).hex()}" for tool in tools}
    for tool, key in keys.items():
        submit(client, request(tool, key, path, sleep_s=sleep_s, first_only=True))
    wait_until(lambda: set(keys.values()) <= set(r.records.counts()), 30, "every tool to start")
    assert first.proc is not None
    kill_group(first.proc)
    first.proc.wait(10)
    killed = time.monotonic()
    second = r.start_worker(concurrency=len(tools))
    results = wait_results(client, list(keys.values()), deadline_s)
    recover_s = time.monotonic() - killed if all(results.values()) else None
    # A redelivery still going would show in the records: wait until the new worker has
    # answered all it received (the killed one answers nothing) and nothing is handed out
    wait_until(
        lambda: all(settled(r, key, [second]) for key in keys.values()),
        30,
        "every delivery to the new worker answered",
    )
    return {
        "recover_s": recover_s,
        "second_pids": set(second.child_pids()),
        **{
            tool: {
                "result": results[key],
                "pids": r.records.pids(key),
                "counted": r.attempts(key),
            }
            for tool, key in keys.items()
        },
    }


def scenario_live_long_tool(r: Rig, *, tool: str, sleep_s: float) -> dict[str, Any]:
    """One invocation that runs ``sleep_s`` on a live worker, with an idle second worker by.

    Returns its result, the pids that ran it, and how many times each worker received it.
    """
    runner = r.start_worker(concurrency=1)
    client = r.client()
    key = f"long-{os.urandom(3).hex()}"
    started = time.monotonic()
    submit(client, request(tool, key, r.records.path, sleep_s=sleep_s))
    wait_until(lambda: r.records.counts()[key] > 0, 20, "the tool to start")
    idle = r.start_worker(concurrency=1)
    result = client.wait(key, timeout=sleep_s + 30)
    elapsed = time.monotonic() - started
    # Acknowledged and answered: nothing is left that could be handed out again late
    wait_until(lambda: settled(r, key), 30, "every delivery answered")
    return {
        "result": result,
        "elapsed_s": elapsed,
        "runs": r.records.counts()[key],
        "received": [deliveries([w], key) for w in (runner, idle)],
    }


def scenario_frozen_worker(r: Rig, *, sleep_s: float, frozen_s: float) -> dict[str, Any]:
    """A non-idempotent write whose worker's main process is frozen (SIGSTOP) while it runs.

    The frozen process stops beating, so it looks dead and its message is handed to a
    second worker, while its pool process (not frozen) goes on with the write: a worker
    cut off from Redis, or paused, for longer than its liveness allows. The main process
    is let go (SIGCONT) after ``frozen_s``.
    """
    first = r.start_worker(concurrency=1)
    client = r.client()
    key = f"frozen-{os.urandom(3).hex()}"
    submit(client, request(WRITE, key, r.records.path, sleep_s=sleep_s))
    wait_until(lambda: r.records.counts()[key] > 0, 20, "the write to start")
    assert first.proc is not None
    os.kill(first.proc.pid, signal.SIGSTOP)
    try:
        r.start_worker(concurrency=1)
        wait_until(lambda: deliveries(r.workers, key) >= 2, frozen_s, "the write handed out again")
    finally:
        os.kill(first.proc.pid, signal.SIGCONT)
    result = client.wait(key, timeout=sleep_s + 30)
    # The redelivery stores its answer after the first run's: wait for both
    wait_until(lambda: settled(r, key), 30, "both deliveries answered")
    return {
        "result": result,
        "final": client.get(key),
        "runs": r.records.counts()[key],
        "deliveries": deliveries(r.workers, key),
        "counted": r.attempts(key),
    }
