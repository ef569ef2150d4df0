"""The fault tests' rig: a private redis-server, workers, the fault catalogue, outcomes."""

from __future__ import annotations

import contextlib
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

import redis

from cleveragents.batch.api import as_items
from cleveragents.batch.api import run_many as batch_runner
from cleveragents.client import SkillClient
from cleveragents.constants import CLAIM_KEY_PREFIX
from cleveragents.settings import Settings
from cleveragents.skills import SkillResult
from tests.conftest import worker_env
from tests.support.procs import RedisServer, Worker
from tests.support.worker_runs import quiet

SKILL = "test/faults"
READ = "test/read"
IDEMPOTENT = "test/write-idempotent"
WRITE = "test/write-once"
POISON = "test/poison"
#: Seconds before Redis hands an unacknowledged message to another consumer (worker and
#: producer alike): short, so that what a killed worker held comes back quickly.
VISIBILITY_S = 4.0
#: CLEVERAGENTS_RECOVERY_S of the rig's workers: a dead worker's messages come back within
#: it (cleveragents/broker/redis/transport.py), whatever the visibility timeout.
RECOVERY_S = 4.0


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
    """A private redis-server with persistence, workers and clients; all ended by PID on close.

    The redis-server is the broker too, unless ``broker`` names another (RabbitMQ):
    then it holds the results only.
    """

    def __init__(
        self,
        root: Path,
        *,
        visibility_s: float | None = VISIBILITY_S,
        broker: str | None = None,
        recovery_s: float | None = RECOVERY_S,
    ) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.visibility_s = visibility_s  # None: the default (as for recovery_s)
        self.recovery_s = recovery_s
        self.broker = broker
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
            url or self.broker or self.url,
            backend=self.url if self.broker else None,  # else the broker's own Redis
            CLEVERAGENTS_HOME=str(self.root / "home"),
        )
        worker = Worker({**env, **self._timing()}, concurrency=concurrency)
        self.workers.append(worker)
        return worker.start()

    def client(self) -> SkillClient:
        settings = Settings.from_env(
            {
                "CLEVERAGENTS_BROKER_URL": self.broker or self.url,
                "CLEVERAGENTS_RESULT_BACKEND": self.url,
                "CLEVERAGENTS_HOME": str(self.root / "home"),
                **self._timing(),
            }
        )
        client = SkillClient(settings=settings)
        self.clients.append(client)
        return client

    def _timing(self) -> dict[str, str]:
        """The visibility timeout and recovery time the rig sets (None: left at the default)."""
        timing = {
            "CLEVERAGENTS_VISIBILITY_TIMEOUT_S": self.visibility_s,
            "CLEVERAGENTS_RECOVERY_S": self.recovery_s,
        }
        return {name: f"{value:g}" for name, value in timing.items() if value is not None}

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

    def quiet(self) -> bool:
        """True when no message waits in a skill queue and, on Redis, none is handed out
        (``worker_runs.quiet``)."""
        return quiet(self.broker or self.url, self.url)

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
def rig(
    root: Path,
    *,
    visibility_s: float | None = VISIBILITY_S,
    broker: str | None = None,
    recovery_s: float | None = RECOVERY_S,
) -> Iterator[Rig]:
    """A ``Rig`` that is closed (every process killed by PID) whatever happens."""
    made = Rig(root, visibility_s=visibility_s, broker=broker, recovery_s=recovery_s)
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
        time.sleep(0.1)  # a bounded poll (deadline) of the stored results


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


class FreezingProxy:
    """A TCP proxy to redis-server whose open connections can go silent, not closed.

    ``freeze()`` stops every connection open now from carrying anything either way,
    while both sides stay open: no FIN, no RST, no reply, as when the peer hangs or
    its machine is cut off. Connections made later pass, as to a Redis reached again.
    """

    def __init__(self, port: int) -> None:
        self.port = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self.listener.getsockname()[1]}/0"
        self.generation = 0  # connections of an earlier generation are frozen
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True, name="freezing-proxy").start()

    def freeze(self) -> None:
        self.generation += 1

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self.listener.accept()
                upstream = socket.create_connection(("127.0.0.1", self.port))
            except OSError:
                return
            self.sockets += [downstream, upstream]
            born = self.generation
            for src, dst in ((downstream, upstream), (upstream, downstream)):
                threading.Thread(target=self._pump, args=(src, dst, born), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, born: int) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if born == self.generation:  # frozen: read and dropped, never answered
                    dst.sendall(data)

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
