"""A soak anyone can repeat: load, batches and chaos for a while, then every promise counted.

    .venv/bin/python benchmarks/soak.py [--minutes 30] [--broker redis|rabbitmq]
        [--workers 3] [--concurrency 2] [--rate 8] [--chaos-every 20] [--seed N] [--json]
        [--keep]

A private ``redis-server`` (append-only file, a free port) holds the results, and the
broker too unless ``--broker rabbitmq`` (then a virtual host of the machine's
RabbitMQ, made and dropped here). Real workers (``celery -A worker worker``, the
fault catalogue of ``tests/fixtures/skills/faults.yaml`` and the examples), each
started and killed by PID. For ``--minutes``:

* two producers submit at ``--rate`` invocations a second between them: quick reads,
  slow reads (1-2 s), writes that must run once, idempotent writes, requests that
  fail validation, and command tools (``local/line-stats``);
* every ``--batch-every`` seconds a batch of ``--batch-lines`` mixed lines runs
  (``SkillClient.run_many``, as ``batch run``), its output checked in input order;
* every ``--chaos-every`` seconds one chaos event, picked at random: ``kill -9`` of a
  worker (a new one is started), ``kill -9`` of one of its pool processes, SIGSTOP of a
  worker for 10-40 s, SIGTERM of a worker (warm shutdown; a new one is started),
  ``kill -9`` of redis-server and a start on its append-only file, and on RabbitMQ a
  drop of every connection of the virtual host (as a broker restart does to its
  clients). A kill of a worker lands while a slow write runs on it when one does.

Then producers stop, the chaos stops, and every submitted invocation is waited for.
It prints: invocations by kind, lost (no result), duplicate writes (a write that must
run once ran twice, counted by the tool's own ledger), batch outputs out of order,
writes answered ``write_interrupted`` (their effect may have happened: the chaos hit
them running), the longest recovery (from a chaos event's start to the result of a
quick read sent as it began), per-invocation keys without a time to live, memory of Redis and
of the workers at start and end, and the ERROR/CRITICAL/traceback lines of the
worker logs by kind, and the timeline of the slowest probe (``benchmarks/soak_probes.py``:
which worker received it, when its tool ran, when its result was stored). The exit
status is 1 when anything was lost, a write ran twice, a batch came out of order, or
a recovery passed its bound: ``CLEVERAGENTS_RECOVERY_S`` (``RECOVERY_S`` here), plus
the outage itself for a kill of Redis or a drop of RabbitMQ's connections; each such
recovery is one ``RECOVERY OVER BOUND`` line. ``--keep`` keeps the run's folder (worker
and Redis logs, the tools' records) and prints where it is.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import redis  # noqa: E402

from benchmarks.soak_probes import Probe, bound_s, queued_ahead, timeline, timeline_lines  # noqa: E402
from cleveragents.skills import SkillResult  # noqa: E402
from tests.support.fault_rig import (  # noqa: E402
    IDEMPOTENT,
    READ,
    WRITE,
    BatchThread,
    Rig,
    reason,
    request,
    rig,
    stored_results,
    submit,
)
from tests.support.procs import Worker  # noqa: E402
from tests.support.rabbit import Rabbit  # noqa: E402

#: A dead worker's invocations come back within this (CLEVERAGENTS_RECOVERY_S).
RECOVERY_S = 8.0
#: Key families an invocation or a batch leaves, each of which must carry a time to live.
PER_INVOCATION = (
    "celery-task-meta-",
    "cleveragents:bind:",
    "cleveragents:claim:",
    "cleveragents:seal:",
    "cleveragents:cancel:",
    "cleveragents:batch:",
)
EVENTS = (
    "kill -9 worker",
    "kill -9 pool process",
    "SIGSTOP worker",
    "SIGTERM worker",
    "kill -9 redis",
    "drop rabbitmq connections",
)
KINDS = ("read", "slow read", "write", "idempotent write", "invalid", "command")
WEIGHTS = (40, 5, 20, 15, 10, 10)


@dataclass
class Report:
    broker: str
    minutes: float
    invocations: Counter[str] = field(default_factory=Counter)
    batches: int = 0
    batch_lines: int = 0
    lost: int = 0
    duplicate_writes: int = 0
    writes: int = 0
    write_ledger_lines: int = 0
    batches_out_of_order: int = 0
    write_interrupted: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    chaos: Counter[str] = field(default_factory=Counter)
    chaos_during_write: int = 0
    longest_recovery_s: float = 0.0
    recovery_by_event: dict[str, float] = field(default_factory=dict)
    keys_without_ttl: Counter[str] = field(default_factory=Counter)
    redis_memory_mb: tuple[float, float] = (0.0, 0.0)
    workers_rss_mb: tuple[float, float] = (0.0, 0.0)
    log_errors: Counter[str] = field(default_factory=Counter)
    elapsed_s: float = 0.0
    #: "event: took s > bound s", one a recovery past its bound (``soak_probes.bound_s``).
    over_bound: list[str] = field(default_factory=list)
    #: The slowest probe's timeline (``soak_probes.timeline_lines``).
    slowest_probe: list[str] = field(default_factory=list)
    kept: str | None = None

    @property
    def held(self) -> bool:
        return (
            self.lost == 0
            and self.duplicate_writes == 0
            and self.batches_out_of_order == 0
            and not self.over_bound
        )


class _Batch(BatchThread):
    """A batch run in a thread that keeps the request id of each entry, in output order."""

    def __init__(self, client: Any, lines: list[dict[str, Any]]) -> None:
        super().__init__(client, lines, chunk_size=50)
        self.ids: list[str] = []

    def _run(self) -> None:
        try:
            for entry in self.runner:
                self.ids.append(entry.request_id)
        except BaseException as exc:  # said in the report
            self.error = exc


class Soak:
    """The running soak: its rig, workers, producers, batches and chaos."""

    def __init__(self, r: Rig, args: argparse.Namespace, report: Report) -> None:
        self.r = r
        self.args = args
        self.report = report
        self.rng = random.Random(args.seed)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.sent: dict[str, dict[str, Any]] = {}  # request id -> request
        self.kind_of: dict[str, str] = {}
        self.batch_threads: list[tuple[_Batch, list[dict[str, Any]]]] = []
        self.logs: list[Path] = []
        self.workers: list[Worker] = []
        self.serial = 0
        self.probe_client = r.client()
        self.probes: list[Probe] = []

    # ---- workers
    def start_worker(self) -> Worker:
        worker = self.r.start_worker(concurrency=self.args.concurrency)
        self.workers.append(worker)
        self.logs.append(worker.log)
        return worker

    def live_workers(self) -> list[Worker]:
        return [w for w in self.workers if w.alive()]

    # ---- load
    def _next_id(self, prefix: str) -> str:
        with self.lock:
            self.serial += 1
            return f"{prefix}-{self.serial:07d}"

    def body(self, kind: str, prefix: str) -> dict[str, Any]:
        key = self._next_id(prefix)
        path = self.r.records.path
        if kind == "read":
            return request(READ, key, path, sleep_s=self.rng.uniform(0, 0.05))
        if kind == "slow read":
            return request(READ, key, path, sleep_s=self.rng.uniform(1, 2))
        if kind == "write":
            return request(WRITE, key, path, sleep_s=self.rng.choice((0.0, 0.0, 1.5)))
        if kind == "idempotent write":
            return request(IDEMPOTENT, key, path, sleep_s=self.rng.uniform(0, 0.2))
        if kind == "invalid":
            body = request(READ, key, path)
            body["arguments"] = {"path": 5}  # fails its schema: validation_error
            return body
        return {  # a command tool
            "request_id": key,
            "skill": "local/inspect",
            "tool": "local/line-stats",
            "arguments": {"text": "one\ntwo\n"},
            "allow_writes": False,
        }

    def producer(self, name: str) -> None:
        client = self.r.client()
        every = 2.0 / self.args.rate  # two producers share the rate
        while not self.stop.is_set():
            kind = self.rng.choices(KINDS, WEIGHTS)[0]
            body = self.body(kind, name)
            try:
                submit(client, body)
            except Exception:  # the broker away: this request was never sent
                self.stop.wait(0.5)
                continue
            with self.lock:
                self.sent[body["request_id"]] = body
                self.kind_of[body["request_id"]] = kind
                self.report.invocations[kind] += 1
            self.stop.wait(every)

    def batches(self) -> None:
        client = self.r.client()
        while not self.stop.wait(self.args.batch_every):
            kinds = self.rng.choices(KINDS[:5], WEIGHTS[:5], k=self.args.batch_lines)
            lines = [self.body(kind, "batch") for kind in kinds]
            thread = _Batch(client, lines)
            thread.start()
            with self.lock:
                self.batch_threads.append((thread, lines))
                self.report.batches += 1
                self.report.batch_lines += len(lines)
                for body, kind in zip(lines, kinds, strict=True):
                    self.sent[body["request_id"]] = body
                    self.kind_of[body["request_id"]] = kind
                    self.report.invocations[f"batch {kind}"] += 1

    # ---- chaos
    def chaos(self) -> None:
        events = [event for event in EVENTS if event in self.args.events]
        if self.r.broker is None and "drop rabbitmq connections" in events:
            events.remove("drop rabbitmq connections")
        while events and not self.stop.wait(self.args.chaos_every):
            self.chaos_event(self.rng.choice(events))

    def chaos_event(self, event: str) -> None:
        """Do ``event`` with a probe sent as it begins, and count the probe's recovery."""
        started = time.monotonic()
        try:
            probe = Probe(self.send_probe(), event, time.time())  # its wait is the recovery
        except Exception as exc:
            print(f"chaos: no probe ({type(exc).__name__}: {exc})", file=sys.stderr)
            return
        # Watched from now on, while the event goes on (a SIGSTOP lasts 10-40 s): the
        # recovery is when its result is stored, not when the event is over.
        watch = threading.Thread(target=self._watch_probe, args=(probe, started), daemon=True)
        watch.start()
        try:
            during_write = self.do(event, probe)
        except Exception as exc:  # a chaos event that could not be done is said
            print(f"chaos {event}: {type(exc).__name__}: {exc}", file=sys.stderr)
            watch.join()
            return
        self.report.chaos[event] += 1
        self.report.chaos_during_write += int(during_write)
        watch.join()
        self.probes.append(probe)
        took, bound = probe.took_s, bound_s(probe, RECOVERY_S)
        self.report.recovery_by_event[event] = max(
            self.report.recovery_by_event.get(event, 0.0), took
        )
        self.report.longest_recovery_s = max(self.report.longest_recovery_s, took)
        over = f"; OVER its bound of {bound:.1f} s" if took > bound else ""
        if over:
            self.report.over_bound.append(f"{event}: {took:.1f} s > {bound:.1f} s")
        print(
            f"  {time.strftime('%H:%M:%S')} chaos: {event}; recovered in {took:.1f} s{over}",
            file=sys.stderr,
            flush=True,
        )

    def _victim(self) -> tuple[Worker, bool]:
        """A live worker, one running a slow write when there is one."""
        live = self.live_workers()
        running_write = self._running_write_pids()
        for worker in live:
            if set(worker.child_pids()) & running_write:
                return worker, True
        return self.rng.choice(live), False

    def _running_write_pids(self) -> set[int]:
        """Pool processes that recorded a slow write in the last second (it sleeps 1.5 s)."""
        recent = time.time() - 1.0
        pids = set()
        for key, pid, at in self.r.records.lines()[-200:]:
            body = self.sent.get(key)
            slow_write = body is not None and body["tool"] == WRITE and body["arguments"]["sleep_s"]
            if at > recent and slow_write:
                pids.add(pid)
        return pids

    def do(self, event: str, probe: Probe) -> bool:
        if event == "kill -9 redis":
            away = time.monotonic()
            self.r.stop_redis(signal.SIGKILL)
            time.sleep(self.rng.uniform(1, 3))
            self.r.start_redis()
            probe.outage_s = time.monotonic() - away
            return False
        if event == "drop rabbitmq connections":
            away = time.monotonic()
            self._drop_rabbitmq_connections()
            probe.outage_s = time.monotonic() - away
            return False
        return self._hit_worker(event)

    def _drop_rabbitmq_connections(self) -> None:
        vhost = str(self.r.broker).rsplit("/", 1)[1]
        out = subprocess.run(
            ["rabbitmqctl", "-q", "list_connections", "-p", vhost, "pid"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        for connection in out.stdout.split():
            subprocess.run(
                ["rabbitmqctl", "-q", "close_connection", connection, "soak: broker restart"],
                capture_output=True,
                timeout=60,
                check=False,
            )

    def _hit_worker(self, event: str) -> bool:
        """Do a worker's ``event``; True when it hit a running write."""
        worker, during_write = self._victim()
        assert worker.proc is not None
        if event == "kill -9 pool process":
            children = worker.child_pids()
            running = self._running_write_pids() & set(children)
            pid = next(iter(running)) if running else self.rng.choice(children)
            os.kill(pid, signal.SIGKILL)
            return bool(running)
        if event == "SIGSTOP worker":
            os.killpg(worker.proc.pid, signal.SIGSTOP)
            time.sleep(self.rng.uniform(10, 40) * self.args.stop_scale)
            os.killpg(worker.proc.pid, signal.SIGCONT)
            return during_write
        if event == "SIGTERM worker":
            worker.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.proc.wait(90)
            worker.stop()
            self.start_worker()
            return during_write
        worker.stop(signal.SIGKILL)  # kill -9 worker: its whole process group
        self.start_worker()
        return during_write

    def send_probe(self) -> str:
        """A quick read, sent now."""
        body = request(READ, self._next_id("probe"), self.r.records.path)
        submit(self.probe_client, body)
        return str(body["request_id"])

    def _watch_probe(self, probe: Probe, started: float) -> None:
        probe.took_s = self.wait_probe(probe.request_id, started)

    def wait_probe(self, request_id: str, started: float) -> float:
        """Seconds from ``started`` to the probe's stored result (inf: none in 180 s)."""
        deadline = started + 180
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError):
                if stored_results(self.probe_client, [request_id])[request_id] is not None:
                    return time.monotonic() - started
            time.sleep(0.1)
        return float("inf")

    def worker_logs(self) -> dict[str, Path]:
        """Each worker's log by the worker's name in the report (``w1``, ``w2``, ...)."""
        return {f"w{n}": worker.log for n, worker in enumerate(self.workers, 1)}

    def explain_slowest(self) -> None:
        """The slowest probe's timeline, into the report."""
        if not self.probes:
            return
        probe = max(self.probes, key=lambda p: p.took_s)
        steps = timeline(probe, self.worker_logs(), self.r.records.lines())
        older, chunks = queued_ahead(probe, self.worker_logs())
        self.report.slowest_probe = [
            *timeline_lines(probe, steps),
            f"  queued ahead of it: {older} invocations sent before it and {chunks} batch "
            "chunks were received after it was sent and before it",
        ]

    def keep(self, folder: Path) -> None:
        """Copy the worker and Redis logs into ``folder`` (the rig removes its own)."""
        logs = folder / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        for name, log in self.worker_logs().items():
            with contextlib.suppress(OSError):
                shutil.copy(log, logs / f"{name}.log")
        with contextlib.suppress(OSError):
            shutil.copy(self.r.redis.dir / "redis.log", logs / "redis.log")


def _rss_mb(workers: list[Worker]) -> float:
    total = 0
    for worker in workers:
        if worker.proc is None or not worker.alive():
            continue
        for pid in [worker.proc.pid, *worker.child_pids()]:
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
    return total / 1024


def _redis_mb(r: Rig) -> float:
    with redis.Redis.from_url(r.url, socket_timeout=5) as client:
        return int(client.info("memory")["used_memory"]) / 2**20


def _keys_without_ttl(r: Rig) -> Counter[str]:
    found: Counter[str] = Counter()
    with redis.Redis.from_url(r.url, socket_timeout=10) as client:
        for key in client.scan_iter(count=1000):
            name = key.decode(errors="replace")
            family = next((p for p in PER_INVOCATION if name.startswith(p)), None)
            if family is not None and client.ttl(key) == -1:
                found[family] += 1
    return found


_NUMBERS = re.compile(r"0x[0-9a-f]+|\d+(\.\d+)?|[0-9a-f]{8,}")


def _log_errors(logs: list[Path]) -> Counter[str]:
    """ERROR and CRITICAL lines of the worker logs by kind (numbers blanked), and
    tracebacks by the line that carried them."""
    kinds: Counter[str] = Counter()
    for log in logs:
        last = "?"
        with contextlib.suppress(OSError):
            for line in log.read_text(errors="replace").splitlines():
                if "Traceback (most recent call last)" in line:
                    kinds[f"Traceback, after {last}"] += 1
                    continue
                match = re.search(r"(WARNING|ERROR|CRITICAL)/[^\]]*\] (.*)", line)
                if match is None:
                    continue
                kind = _NUMBERS.sub("N", f"{match.group(1)}: {match.group(2)}")[:110]
                last = kind
                if match.group(1) != "WARNING":
                    kinds[kind] += 1
    return kinds


def _count_outcomes(s: Soak, report: Report) -> None:
    """Wait for every batch and invocation; count what was lost, ran twice, failed."""
    client = s.r.client()
    for batch, lines in s.batch_threads:
        batch.join(300)
        got = batch.ids
        if got != [line["request_id"] for line in lines][: len(got)] or batch.error:
            report.batches_out_of_order += 1
    ids = list(s.sent)
    results: dict[str, SkillResult | None] = {}
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        with contextlib.suppress(redis.RedisError):
            results = stored_results(client, ids)
            if all(results.values()):
                break
        time.sleep(1)
    counts = s.r.records.counts()
    for rid, body in s.sent.items():
        result = results.get(rid)
        if result is None:
            report.lost += 1
            continue
        if body["tool"] == WRITE:
            report.writes += 1
            report.write_ledger_lines += counts[rid]
            report.duplicate_writes += max(0, counts[rid] - 1)
        if not result.success and result.error is not None:
            why = reason(result)
            if why == "write_interrupted":
                report.write_interrupted += 1
            report.failures[f"{result.error.error_type.value}/{why or '-'}"] += 1


def soak(args: argparse.Namespace, root: Path, broker: str | None) -> Report:
    report = Report(args.broker, args.minutes)
    started = time.monotonic()
    with rig(root, broker=broker, recovery_s=RECOVERY_S, visibility_s=None) as r:
        s = Soak(r, args, report)
        for _ in range(args.workers):
            s.start_worker()
        time.sleep(1)
        memory_start, rss_start = _redis_mb(r), _rss_mb(s.workers)
        threads = [
            threading.Thread(target=s.producer, args=(f"p{n}",), daemon=True) for n in (1, 2)
        ]
        threads += [
            threading.Thread(target=s.batches, daemon=True),
            threading.Thread(target=s.chaos, daemon=True),
        ]
        for thread in threads:
            thread.start()
        s.stop.wait(args.minutes * 60)
        s.stop.set()
        for thread in threads:
            thread.join(300)
        # Every worker runs again, and every invocation is waited for
        for worker in s.workers:
            if worker.proc is not None and worker.alive():
                with contextlib.suppress(OSError):
                    os.killpg(worker.proc.pid, signal.SIGCONT)
        _count_outcomes(s, report)
        # A round of the key sweep (every 10 s) gives producers' bindings a time to live
        settle = time.monotonic() + 12
        report.keys_without_ttl = _keys_without_ttl(r)
        while report.keys_without_ttl and time.monotonic() < settle:
            time.sleep(1)
            report.keys_without_ttl = _keys_without_ttl(r)
        report.redis_memory_mb = (round(memory_start, 1), round(_redis_mb(r), 1))
        report.workers_rss_mb = (round(rss_start, 1), round(_rss_mb(s.workers), 1))
        report.log_errors = _log_errors(s.logs)
        s.explain_slowest()
        if args.keep:
            s.keep(root)
            report.kept = str(root)
    report.elapsed_s = round(time.monotonic() - started, 1)
    return report


def print_report(report: Report) -> None:
    total = sum(report.invocations.values())
    print(f"soak on {report.broker}, {report.minutes:g} min ({report.elapsed_s:.0f} s in all)")
    print(f"invocations: {total:,} ({report.batches} batches of {report.batch_lines:,} lines)")
    for kind, n in sorted(report.invocations.items()):
        print(f"  {kind:<24} {n:>8,}")
    print(f"lost: {report.lost}")
    print(
        f"duplicate writes: {report.duplicate_writes} ({report.writes:,} writes that must run "
        f"once, {report.write_ledger_lines:,} ledger lines)"
    )
    print(f"batches out of order: {report.batches_out_of_order}")
    print(f"writes answered write_interrupted: {report.write_interrupted}")
    print(f"chaos: {dict(report.chaos)} ({report.chaos_during_write} during a running write)")
    print(
        f"longest recovery: {report.longest_recovery_s:.1f} s; by event: "
        + ", ".join(f"{k} {v:.1f} s" for k, v in sorted(report.recovery_by_event.items()))
    )
    print(f"per-invocation keys without a time to live: {dict(report.keys_without_ttl) or 0}")
    print(
        f"Redis memory: {report.redis_memory_mb[0]} MB at start, {report.redis_memory_mb[1]} MB "
        f"at end; workers' RSS: {report.workers_rss_mb[0]} MB, {report.workers_rss_mb[1]} MB"
    )
    print(
        "failed results by type/reason: "
        + (", ".join(f"{k} {v}" for k, v in report.failures.most_common()) or "none")
    )
    print("worker log ERROR/CRITICAL/traceback lines by kind:")
    for kind, n in report.log_errors.most_common():
        print(f"  {n:>5}  {kind}")
    if not report.log_errors:
        print("  none")
    for line in report.slowest_probe:
        print(line)
    for line in report.over_bound:
        print(f"RECOVERY OVER BOUND: {line}")
    if report.kept:
        print(f"kept: {report.kept} (logs/: worker and Redis logs; records: the tools' runs)")
    print(
        "HELD"
        if report.held
        else "BROKEN: lost, duplicate writes, batches out of order or a recovery over its bound"
    )


@contextlib.contextmanager
def _broker(name: str) -> Iterator[str | None]:
    if name != "rabbitmq":
        yield None
        return
    rabbit = Rabbit()
    try:
        with rabbit.vhost() as url:
            yield url
    finally:
        rabbit.close()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--broker", choices=("redis", "rabbitmq"), default="redis")
    parser.add_argument(
        "--workers",
        type=int,
        default=3,
        help="workers (3: the fleet keeps up with the load with one of them down; with 2, "
        "one worker served less than the load, and a probe waited behind the backlog an "
        "event built: up to 111 invocations, 32 s, long after the recovery itself)",
    )
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument(
        "--rate",
        type=float,
        default=8.0,
        help="invocations a second (8, and a batch line every 0.2 s: about two thirds of "
        "what 2 workers of 2 serve, so that 3 keep up with one worker down)",
    )
    parser.add_argument("--batch-every", type=float, default=60.0, help="seconds (60)")
    parser.add_argument("--batch-lines", type=int, default=300)
    parser.add_argument("--chaos-every", type=float, default=20.0, help="seconds (20)")
    parser.add_argument(
        "--stop-scale", type=float, default=1.0, help="SIGSTOP lengths times this (1: 10-40 s)"
    )
    parser.add_argument(
        "--events",
        type=lambda text: [e.strip() for e in text.split(",") if e.strip()],
        default=list(EVENTS),
        help="the chaos events to pick from, comma-separated (all of: " + ", ".join(EVENTS) + ")",
    )
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--keep", action="store_true", help="keep the run's folder (logs, records) and say where"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.seed is None:
        args.seed = random.randrange(1 << 30)
    for name in list(os.environ):
        if name.startswith("CLEVERAGENTS_"):
            del os.environ[name]
    print(f"seed {args.seed}", file=sys.stderr)
    root = Path(tempfile.mkdtemp(prefix="soak-"))
    try:
        with _broker(args.broker) as broker:
            report = soak(args, root, broker)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    if args.json:
        fields = {name: getattr(report, name) for name in report.__dataclass_fields__}
        print(json.dumps({**fields, "held": report.held}))  # (asdict miscopies a Counter)
    else:
        print_report(report)
    return 0 if report.held else 1


if __name__ == "__main__":
    sys.exit(main())
