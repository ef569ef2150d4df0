"""Faults: worker processes and Redis killed and restarted, by PID, at chosen moments.

Every test gets its own private ``redis-server`` (a free port, AOF on with
``appendfsync always``) and real worker processes, and kills all of them by PID
when it ends. The invariants, counted rather than sampled:

* results stored = requests accepted (nothing is lost);
* a non-idempotent write runs at most once per request id (the tool itself
  appends ``<key> <pid>`` to a file on every execution, so the count is the
  tool's own);
* a poison message (a tool that kills its process every time) is finished with a
  failure after a bounded number of deliveries, and the worker keeps serving.

The ``scenario_*`` functions return what they measured, so that
``benchmarks/fault_table.py`` runs the same code larger and several times.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from cleveragents.batch.api import as_items
from cleveragents.batch.api import run_many as batch_runner
from cleveragents.client import SkillClient
from cleveragents.constants import CLAIM_KEY_PREFIX
from cleveragents.guard import MAX_ATTEMPTS
from cleveragents.settings import Settings
from cleveragents.skills import SkillErrorType, SkillResult
from tests.conftest import worker_env
from tests.procs import RedisServer, Worker, kill_group, wait_until

SKILL = "test/faults"
READ = "test/read"
IDEMPOTENT = "test/write-idempotent"
WRITE = "test/write-once"
POISON = "test/poison"
#: Seconds before Redis hands an unacknowledged message to another consumer (worker and
#: producer alike): short, so that what a killed worker held comes back quickly.
VISIBILITY_S = 4.0


# --------------------------------------------------------------------------- helpers


@dataclass
class Outcome:
    """What one run of a scenario measured."""

    scenario: str
    invocations: int
    lost: int = 0  # requests without a stored result at the end
    write_dupes: int = 0  # executions of non-idempotent writes beyond one per request id
    other_dupes: int = 0  # executions of reads and idempotent writes beyond one per id
    recover_s: float | None = None  # see each scenario
    interrupted: int = 0  # writes answered "write_interrupted" (may or may not have run)
    failed: int = 0  # other failed results (poison messages included)
    client_error: str | None = None  # what the producer side raised, if anything
    notes: list[str] = field(default_factory=list)


class Records:
    """The executions recorded by the fault tools: one ``<key> <pid> <time>`` line each."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def lines(self) -> list[tuple[str, int, float]]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        out = []
        for line in text.splitlines():
            key, pid, at = line.split(" ")
            out.append((key, int(pid), float(at)))
        return out

    def counts(self) -> Counter[str]:
        return Counter(key for key, _, _ in self.lines())

    def pids(self, key: str) -> list[int]:
        return [pid for k, pid, _ in self.lines() if k == key]

    def busy(self, pids: Iterable[int], within_s: float) -> bool:
        """True when each of ``pids`` started a tool within the last ``within_s`` seconds."""
        recent = time.time() - within_s
        latest: dict[int, float] = {}
        for _, pid, at in self.lines():
            latest[pid] = at
        return all(latest.get(pid, 0.0) > recent for pid in pids)


class Rig:
    """A private redis-server with persistence, workers and clients; all ended by PID on close."""

    def __init__(self, root: Path, *, visibility_s: float = VISIBILITY_S) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.visibility_s = visibility_s
        self.records = Records(root / "records")
        self.redis = RedisServer(persistence=True)
        self.workers: list[Worker] = []
        self.clients: list[SkillClient] = []
        self.redis.start()

    @property
    def url(self) -> str:
        return self.redis.url

    def start_worker(self, *, concurrency: int = 2, url: str | None = None) -> Worker:
        env = worker_env(
            url or self.url,
            CLEVERAGENTS_VISIBILITY_TIMEOUT_S=f"{self.visibility_s:g}",
            CLEVERAGENTS_HOME=str(self.root / "home"),
        )
        worker = Worker(env, concurrency=concurrency)
        self.workers.append(worker)
        return worker.start()

    def client(self) -> SkillClient:
        settings = Settings.from_env(
            {
                "CLEVERAGENTS_BROKER_URL": self.url,
                "CLEVERAGENTS_VISIBILITY_TIMEOUT_S": f"{self.visibility_s:g}",
                "CLEVERAGENTS_HOME": str(self.root / "home"),
            }
        )
        client = SkillClient(settings=settings)
        self.clients.append(client)
        return client

    def stop_redis(self, sig: int = signal.SIGKILL) -> None:
        self.redis.stop(sig)

    def start_redis(self) -> None:
        """Start redis-server again on the same port and folder: it reloads its AOF."""
        self.redis.start()

    def _redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_timeout=5)

    def stored(self) -> int:
        """How many invocation results the backend holds (0 while Redis is down)."""
        try:
            with self._redis() as client:
                return sum(1 for _ in client.scan_iter("celery-task-meta-*", count=1000))
        except redis.RedisError:
            return 0

    def attempts(self, request_id: str) -> int:
        """Deliveries the guard counted for ``request_id``."""
        with self._redis() as client:
            return int(client.get(f"{CLAIM_KEY_PREFIX}attempts:{request_id}") or 0)

    def dead_letters(self) -> list[bytes]:
        with self._redis() as client:
            return list(client.lrange(f"{CLAIM_KEY_PREFIX}dead-letter", 0, -1))

    def close(self) -> None:
        for client in self.clients:
            with contextlib.suppress(Exception):
                client.close()
        for worker in self.workers:
            worker.stop()
            shutil.rmtree(worker.dir, ignore_errors=True)
        self.redis.stop()
        shutil.rmtree(self.redis.dir, ignore_errors=True)


@contextlib.contextmanager
def rig(root: Path, *, visibility_s: float = VISIBILITY_S) -> Iterator[Rig]:
    """A ``Rig`` that is closed (every process killed by PID) whatever happens."""
    made = Rig(root, visibility_s=visibility_s)
    try:
        yield made
    finally:
        made.close()


def request(
    tool: str, key: str, path: Path, *, sleep_s: float = 0.0, first_only: bool = False
) -> dict[str, Any]:
    """A request for a fault tool, whose request id is its record key."""
    arguments: dict[str, Any] = {"path": str(path), "key": key}
    if tool != POISON:
        arguments.update(sleep_s=sleep_s, first_only=first_only)
    return {
        "request_id": key,
        "skill": SKILL,
        "tool": tool,
        "arguments": arguments,
        "allow_writes": tool in (WRITE, IDEMPOTENT),
    }


def mixed_requests(n: int, path: Path, *, sleep_s: float, prefix: str) -> list[dict[str, Any]]:
    """``n`` requests, a third each reads, idempotent writes and non-idempotent writes."""
    tools = (READ, IDEMPOTENT, WRITE)
    return [request(tools[i % 3], f"{prefix}-{i:05d}", path, sleep_s=sleep_s) for i in range(n)]


def submit(client: SkillClient, body: dict[str, Any]) -> str:
    """Submit one request (a dict of the wire shape); return its id."""
    fields = ("skill", "tool", "arguments", "allow_writes", "request_id")
    return client.submit(client.build_request(**{k: body[k] for k in fields})).request_id


def reason(result: SkillResult | None) -> Any:
    """``details["reason"]`` of a failed result."""
    return None if result is None or result.error is None else result.error.details.get("reason")


def stored_results(client: SkillClient, ids: Iterable[str]) -> dict[str, SkillResult | None]:
    """The stored result of each id (None where there is none), read in one round trip."""
    ids = list(ids)
    payloads = client.results.get_payloads(ids)
    return {
        rid: None if p is None else SkillResult.model_validate(p)
        for rid, p in zip(ids, payloads, strict=True)
    }


def wait_results(
    client: SkillClient, ids: list[str], timeout: float
) -> dict[str, SkillResult | None]:
    """Poll the store until every id has a result or ``timeout`` passes; Redis may be down."""
    deadline = time.monotonic() + timeout
    results: dict[str, SkillResult | None] = dict.fromkeys(ids)
    while True:
        with contextlib.suppress(redis.RedisError):
            results = stored_results(client, ids)
            if all(results.values()):
                return results
        if time.monotonic() > deadline:
            return results
        time.sleep(0.1)


def tally(
    outcome: Outcome,
    requests: list[dict[str, Any]],
    results: dict[str, SkillResult | None],
    records: Records,
) -> Outcome:
    """Count lost results and duplicate executions; check what each write's result says."""
    counts = records.counts()
    for body in requests:
        rid, tool = body["request_id"], body["tool"]
        result = results.get(rid)
        runs = counts[rid]
        if tool == WRITE:
            outcome.write_dupes += max(0, runs - 1)
        elif tool != POISON:
            outcome.other_dupes += max(0, runs - 1)
        if result is None:
            outcome.lost += 1
        elif result.success:
            assert runs >= 1, f"{rid}: succeeded without running"
            if tool == WRITE:
                assert runs == 1, f"{rid}: a successful write ran {runs} times"
        elif tool == WRITE and reason(result) == "write_interrupted":
            outcome.interrupted += 1
        else:
            outcome.failed += 1
    return outcome


class BatchThread:
    """``SkillClient.run_many``'s runner, consumed in a thread; stopped when it overruns."""

    def __init__(self, client: SkillClient, requests: list[dict[str, Any]], chunk_size: int):
        self.runner = batch_runner(client, as_items(requests), chunk_size=chunk_size)
        self.results: list[SkillResult] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True, name="batch")

    def _run(self) -> None:
        try:
            for entry in self.runner:
                self.results.append(SkillResult.model_validate(entry.payload or {}))
        except BaseException as exc:  # reported by the test's thread
            self.error = exc

    def start(self) -> BatchThread:
        self.thread.start()
        return self

    def join(self, timeout: float) -> bool:
        """True when the batch ended by itself within ``timeout`` seconds."""
        self.thread.join(max(0.0, timeout))
        if self.thread.is_alive():
            self.runner.stop()
            self.thread.join(5)
            return False
        return True

    def describe_error(self) -> str | None:
        return None if self.error is None else f"{type(self.error).__name__}: {self.error}"


class CuttingProxy:
    """A TCP proxy to redis-server that cuts the connection carrying a chosen reply.

    Once ``arm(marker)`` is called, the first chunk from Redis that holds ``marker`` is
    dropped and both sides of that connection are closed: Redis has done the command
    (a BRPOP has taken the message off its list), and the client never hears of it,
    as when a connection breaks, or Redis dies, right after answering.
    """

    def __init__(self, port: int) -> None:
        self.port = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self.listener.getsockname()[1]}/0"
        self.marker: bytes | None = None
        self.cut = threading.Event()
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True, name="proxy").start()

    def arm(self, marker: str) -> None:
        self.marker = marker.encode()

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self.listener.accept()
                upstream = socket.create_connection(("127.0.0.1", self.port))
            except OSError:
                return
            self.sockets += [downstream, upstream]
            for src, dst, from_redis in (
                (downstream, upstream, False),
                (upstream, downstream, True),
            ):
                threading.Thread(
                    target=self._pump, args=(src, dst, from_redis), daemon=True
                ).start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_redis: bool) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                marker = self.marker
                if from_redis and marker and marker in data and not self.cut.is_set():
                    self.cut.set()
                    break  # the reply is lost with the connection
                dst.sendall(data)
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self.listener.close()
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.close()


def served(client: SkillClient, path: Path, key: str, timeout: float) -> bool:
    """True when a fresh read submitted now comes back, successful, within ``timeout``."""
    rid = submit(client, request(READ, key, path))
    result = wait_results(client, [rid], timeout)[rid]
    return result is not None and result.success


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
    time.sleep(down_s)
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
        time.sleep(1)  # nothing in flight, not even an ack
    r.stop_redis(signal.SIGTERM)
    time.sleep(down_s)
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


def deliveries(workers: Iterable[Worker], request_id: str) -> int:
    """How many times the workers received ``skills.invoke`` for ``request_id`` (their logs)."""
    line = f"Task skills.invoke[{request_id}] received"
    return sum(worker.log_text().count(line) for worker in workers)


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
    time.sleep(1.0)  # let the last delivery store what it stores
    return {
        "first_seen": first_seen,
        "final": client.get(key),
        "runs": r.records.counts()[key],
        "deliveries": deliveries(r.workers, key),
    }


def scenario_outlive_visibility(r: Rig, *, sleep_s: float) -> dict[str, Any]:
    """A non-idempotent write that sleeps past the visibility timeout; Redis redelivers it.

    Worker A (one process) runs it. Once the visibility timeout has passed, worker B
    starts: its start-up sweep hands the still-unacknowledged message out again (to B,
    as A's only process is busy).
    """
    r.start_worker(concurrency=1)
    client = r.client()
    key = f"slow-{os.urandom(3).hex()}"
    submit(client, request(WRITE, key, r.records.path, sleep_s=sleep_s))
    wait_until(lambda: r.records.counts()[key] > 0, 20, "the write to start")
    time.sleep(r.visibility_s + 0.5)
    r.start_worker(concurrency=1)
    wait_until(lambda: deliveries(r.workers, key) >= 2, sleep_s + 10, "Redis to redeliver it")
    result = client.wait(key, timeout=sleep_s + 30)
    time.sleep(1.0)  # the redelivery stores its answer after the first run's
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
    time.sleep(0.5)
    return {
        "result": result,
        "runs": r.records.counts()[key],
        "elapsed_s": elapsed,
        "served_after": served(client, r.records.path, "after-poison", 30),
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


# --------------------------------------------------------------------------- tests


@pytest.fixture
def fault_rig(tmp_path: Path) -> Iterator[Rig]:
    with rig(tmp_path / "rig") as made:
        yield made


@pytest.fixture
def short_visibility_rig(tmp_path: Path) -> Iterator[Rig]:
    with rig(tmp_path / "rig", visibility_s=2.0) as made:
        yield made


# 1. A pool process killed mid-tool.


@pytest.mark.timeout(60)
def test_a_killed_pool_process_reruns_reads_but_never_a_write(fault_rig: Rig) -> None:
    seen = scenario_child_kill_mid_tool(fault_rig, tools=(READ, IDEMPOTENT, WRITE))

    for tool in (READ, IDEMPOTENT):
        result = seen[tool]["result"]
        assert result.success, (tool, result.error)
        assert len(seen[tool]["pids"]) == 2, seen[tool]  # run again, after the kill
        assert seen[tool]["pids"][1] != seen[tool]["killed"]
    write = seen[WRITE]
    assert len(write["pids"]) == 1, write  # never run again
    result = write["result"]
    assert not result.success
    assert result.error is not None
    assert result.error.error_type == SkillErrorType.TOOL_EXECUTION_FAILURE
    assert reason(result) == "write_interrupted"
    for tool in seen:
        assert seen[tool]["stored"] == seen[tool]["result"]


@pytest.mark.timeout(90)
def test_pool_processes_killed_under_load_lose_nothing_and_repeat_no_write(
    fault_rig: Rig,
) -> None:
    outcome = scenario_child_kills_under_load(fault_rig, 30, kills=3, deadline_s=45)

    assert outcome.lost == 0, outcome
    assert outcome.write_dupes == 0, outcome
    assert outcome.failed == 0, outcome  # reads and idempotent writes were simply rerun


# 2. The whole worker killed mid-batch, then a new worker.


@pytest.mark.timeout(90)
def test_a_batch_whose_worker_is_killed_completes_on_a_new_worker(fault_rig: Rig) -> None:
    # The new worker comes up once the visibility timeout of the killed one's messages
    # has passed: its start-up sweep hands them out again.
    outcome = scenario_worker_kill(fault_rig, 150, restart_after_s=VISIBILITY_S + 0.5)

    print(outcome)
    assert outcome.client_error is None, outcome
    assert outcome.lost == 0, outcome
    assert outcome.write_dupes == 0, outcome
    assert outcome.recover_s is not None, outcome
    assert outcome.recover_s < 20, outcome


@pytest.mark.timeout(60)
def test_a_worker_restarted_at_once_recovers_within_the_visibility_timeout(
    fault_rig: Rig,
) -> None:
    outcome = scenario_worker_kill(fault_rig, 150, restart_after_s=0.0, deadline_s=VISIBILITY_S + 8)

    print(outcome)
    assert outcome.write_dupes == 0, outcome
    assert outcome.lost == 0, outcome
    assert outcome.recover_s is not None, outcome


# 3. redis-server restarted mid-batch.


@pytest.mark.timeout(60)
def test_workers_store_every_result_of_a_batch_across_a_redis_kill_and_restart(
    fault_rig: Rig,
) -> None:
    outcome = scenario_redis_restart(fault_rig, 150, down_s=0.0, sig=signal.SIGKILL)

    print(outcome)
    assert outcome.lost == 0, outcome
    assert outcome.write_dupes == 0, outcome
    assert "the worker process exited" not in outcome.notes, outcome


@pytest.mark.timeout(60)
def test_workers_store_every_result_of_a_batch_across_a_3s_redis_stop(fault_rig: Rig) -> None:
    outcome = scenario_redis_restart(fault_rig, 150, down_s=3.0, sig=signal.SIGTERM)

    print(outcome)
    assert outcome.lost == 0, outcome
    assert outcome.write_dupes == 0, outcome
    assert "the worker process exited" not in outcome.notes, outcome


@pytest.mark.timeout(60)
def test_run_many_itself_rides_out_a_3s_redis_outage(fault_rig: Rig) -> None:
    outcome = scenario_redis_restart(fault_rig, 60, down_s=3.0)

    print(outcome)
    assert outcome.lost == 0, outcome  # the workers' part
    assert outcome.client_error is None, outcome  # the producer's part
    assert not outcome.notes, outcome


# 4. A worker that loses Redis for a while.


@pytest.mark.timeout(60)
def test_an_idle_worker_serves_new_submissions_after_a_5s_redis_outage(fault_rig: Rig) -> None:
    outcome = scenario_redis_outage(fault_rig, down_s=5.0, busy=False)

    print(outcome)
    assert outcome.lost == 0, outcome
    assert not outcome.notes, outcome
    assert outcome.recover_s is not None, outcome
    assert outcome.recover_s < 15, outcome


@pytest.mark.timeout(60)
def test_a_busy_worker_serves_new_submissions_after_a_5s_redis_outage(fault_rig: Rig) -> None:
    outcome = scenario_redis_outage(fault_rig, down_s=5.0, busy=True, deadline_s=10)

    print(outcome)
    assert outcome.lost == 0, outcome
    assert not outcome.notes, outcome


@pytest.mark.xfail(
    strict=True,
    reason=(
        "kombu's Redis transport takes a message off its list with BRPOP and records it "
        "as unacknowledged only afterwards, from the worker: a connection that breaks "
        "(or a Redis that dies) between the two loses the invocation for good; nothing "
        "(no visibility timeout, no producer) ever sends it again"
    ),
)
@pytest.mark.timeout(60)
def test_an_invocation_whose_fetch_reply_is_lost_still_gets_a_result(fault_rig: Rig) -> None:
    seen = scenario_reply_lost_in_flight(fault_rig, wait_s=VISIBILITY_S + 6)

    assert seen["served_after"], seen  # the worker itself recovered
    assert seen["worker_alive"], seen
    assert seen["result"] is not None, seen  # the invocation did not


# 5. At most once.


@pytest.mark.timeout(60)
def test_a_write_submitted_twice_while_it_runs_is_executed_once(fault_rig: Rig) -> None:
    seen = scenario_duplicate_submission(fault_rig, copies=2, sleep_s=3.0, concurrency=2)

    assert seen["deliveries"] == 2  # the second copy was delivered, while the first ran
    assert seen["runs"] == 1
    assert seen["first_seen"].success, seen
    assert seen["final"] == seen["first_seen"]


@pytest.mark.timeout(60)
def test_a_write_submitted_four_times_while_it_runs_keeps_its_result(fault_rig: Rig) -> None:
    seen = scenario_duplicate_submission(fault_rig, copies=4, sleep_s=2.0, concurrency=2)

    assert seen["runs"] == 1
    assert seen["first_seen"].success, seen
    assert seen["final"] == seen["first_seen"], seen["final"]


@pytest.mark.timeout(60)
def test_a_write_outliving_the_visibility_timeout_is_executed_once(
    short_visibility_rig: Rig,
) -> None:
    seen = scenario_outlive_visibility(short_visibility_rig, sleep_s=7.0)

    assert seen["deliveries"] >= 2  # Redis did hand it out again while it ran
    # Deliveries that find the first run alive are not counted towards poison: the
    # result below is the first run's success, not a poison_message failure.
    assert seen["runs"] == 1
    assert seen["result"].success, seen
    assert seen["final"] == seen["result"]


@pytest.mark.timeout(60)
def test_a_finished_request_submitted_again_returns_the_stored_result(fault_rig: Rig) -> None:
    fault_rig.start_worker()
    client = fault_rig.client()
    body = request(WRITE, "done-once", fault_rig.records.path)
    first = client.wait(submit(client, body), timeout=30)
    assert first.success, first.error

    again = client.submit(client.build_request(**{k: body[k] for k in body}))
    second = again.result(timeout=5)

    assert second == first
    assert fault_rig.records.counts()["done-once"] == 1
    assert deliveries(fault_rig.workers, "done-once") == 1  # nothing was sent again


# 6. Poison.


@pytest.mark.timeout(60)
def test_a_poison_invocation_ends_after_bounded_deliveries(fault_rig: Rig) -> None:
    seen = scenario_poison(fault_rig)

    result = seen["result"]
    assert not result.success
    assert result.error is not None
    assert result.error.error_type == SkillErrorType.TOOL_EXECUTION_FAILURE
    assert reason(result) == "poison_message"
    assert seen["runs"] == MAX_ATTEMPTS
    assert seen["served_after"]
    assert seen["worker_alive"]
    assert len(seen["dead_letters"]) == 1


@pytest.mark.timeout(60)
def test_a_poison_invocation_in_a_batch_chunk_ends_after_bounded_deliveries(
    fault_rig: Rig,
) -> None:
    outcome = scenario_poison_in_batch(fault_rig, 40, poisons=1)

    print(outcome)
    assert outcome.client_error is None, outcome
    assert outcome.recover_s is not None, outcome  # the batch ended, every result yielded
    assert outcome.lost == 0, outcome
    assert outcome.write_dupes == 0, outcome
    # Its chunk's first delivery is not counted; the next ones are: MAX_ATTEMPTS runs.
    assert fault_rig.records.counts()["pb-poison-0"] == MAX_ATTEMPTS
    assert outcome.notes[0].endswith("reason poison_message"), outcome.notes
    assert "not served afterwards" not in outcome.notes
    assert "the worker process exited" not in outcome.notes


@pytest.mark.timeout(60)
def test_invocations_sharing_a_chunk_with_a_poison_one_succeed(fault_rig: Rig) -> None:
    outcome = scenario_poison_in_batch(fault_rig, 40, poisons=1)

    print(outcome)
    assert outcome.lost == 0, outcome
    assert outcome.failed == 1, outcome  # the poison one, and only it
