"""Async client benchmark: 1,000 concurrent trivial invocations three ways, in one run.

Run it from the repository root with ``.venv/bin/python benchmarks/async_client.py``
(options: ``--jobs 1000``, ``--warmup 50``, ``--rounds 1``, ``--concurrency 2``,
``--redis-url URL``). It starts a private ``redis-server`` (no persistence, a free
port) unless ``--redis-url`` is given, and one worker (``celery -A worker worker``,
prefork, ``--concurrency`` processes) with the example catalogue; every
invocation is ``local/common`` / ``local/noop`` with no arguments.

* **async**: ``AsyncSkillClient``: ``--jobs`` coroutines, each ``await client.invoke(...)``,
  gathered on one event loop (sends in the client's 4 threads, results on one
  pub/sub connection);
* **sync**: one ``SkillClient``: every submit in turn, then every ``result()`` in turn
  (the way a synchronous producer does many at once);
* **to_thread**: ``--jobs`` coroutines, each ``await asyncio.to_thread(invoke)`` where
  ``invoke`` is ``SkillClient.submit(...).result()`` on a client of that thread (Celery's
  result consumer is not safe to share between threads): what a user writes by hand
  today; asyncio's default pool has ``min(32, cores + 4)`` threads.

For each: throughput (jobs/s from the first submit to the last result), the p50 and
p99 of each invocation's time from its submit to its result in the caller's hands,
and the CPU time of this (the client's) process per invocation (``getrusage``, every
thread). Rounds alternate the order. Prints a table, then the ratios of async to
the two others. Exit status 0.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from cleveragents.aio import AsyncSkillClient  # noqa: E402
from cleveragents.client import SkillClient  # noqa: E402
from cleveragents.settings import Settings  # noqa: E402
from tests.support.procs import EXAMPLE_SKILLS, RedisServer, Worker  # noqa: E402

SKILL, TOOL = "local/common", "local/noop"


@dataclass
class Run:
    """One way's measurement of one round."""

    way: str
    seconds: float
    latencies: list[float]
    cpu_s: float

    @property
    def jobs_per_s(self) -> float:
        return len(self.latencies) / self.seconds

    def percentile_ms(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    @property
    def cpu_us(self) -> float:
        return 1e6 * self.cpu_s / len(self.latencies)


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@contextmanager
def _measured(way: str, jobs: int, out: list[Run]) -> Iterator[list[float]]:
    latencies: list[float] = []
    cpu, started = _cpu(), time.perf_counter()
    yield latencies
    seconds, used = time.perf_counter() - started, _cpu() - cpu
    assert len(latencies) == jobs, (way, len(latencies))
    out.append(Run(way, seconds, latencies, used))


async def _async_way(settings: Settings, jobs: int, out: list[Run] | None) -> None:
    async with AsyncSkillClient(settings=settings) as client:

        async def one(latencies: list[float]) -> None:
            asked = time.perf_counter()
            result = await client.invoke(SKILL, TOOL, {}, timeout=300)
            assert result.success, result.error
            latencies.append(time.perf_counter() - asked)

        sink: list[Run] = [] if out is None else out
        with _measured("async", jobs, sink) as latencies:
            await asyncio.gather(*(one(latencies) for _ in range(jobs)))


def _sync_way(settings: Settings, jobs: int, out: list[Run] | None) -> None:
    with SkillClient(settings=settings) as client:
        sink: list[Run] = [] if out is None else out
        with _measured("sync", jobs, sink) as latencies:
            sent = [(time.perf_counter(), client.submit(SKILL, TOOL, {})) for _ in range(jobs)]
            for asked, handle in sent:
                assert handle.result(timeout=300).success
                latencies.append(time.perf_counter() - asked)


async def _to_thread_way(settings: Settings, jobs: int, out: list[Run] | None) -> None:
    local = threading.local()
    clients: list[SkillClient] = []

    def invoke() -> None:
        client = getattr(local, "client", None)
        if client is None:
            client = local.client = SkillClient(settings=settings)
            clients.append(client)
        assert client.submit(SKILL, TOOL, {}).result(timeout=300).success

    async def one(latencies: list[float]) -> None:
        asked = time.perf_counter()
        await asyncio.to_thread(invoke)
        latencies.append(time.perf_counter() - asked)

    # asyncio's default pool, as to_thread uses it, made explicit to close it after
    pool = ThreadPoolExecutor(min(32, (os.cpu_count() or 1) + 4))
    asyncio.get_running_loop().set_default_executor(pool)
    sink: list[Run] = [] if out is None else out
    with _measured("to_thread", jobs, sink) as latencies:
        await asyncio.gather(*(one(latencies) for _ in range(jobs)))
    pool.shutdown()
    for client in clients:
        client.close()


def run_way(way: str, settings: Settings, jobs: int, out: list[Run] | None) -> None:
    if way == "async":
        asyncio.run(_async_way(settings, jobs, out))
    elif way == "sync":
        _sync_way(settings, jobs, out)
    else:
        asyncio.run(_to_thread_way(settings, jobs, out))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--redis-url")
    args = parser.parse_args(argv)

    server = None if args.redis_url else RedisServer(persistence=False).start()
    url = args.redis_url or (server.url if server else "")
    env = {
        "CLEVERAGENTS_BROKER_URL": url,
        "CLEVERAGENTS_RESULT_BACKEND": url,
        "CLEVERAGENTS_CATALOGUE": str(EXAMPLE_SKILLS),
    }
    worker = Worker(env, concurrency=args.concurrency)
    settings = Settings.from_env(env)
    ways = ["async", "sync", "to_thread"]
    runs: list[Run] = []
    try:
        worker.start()
        for way in ways:
            run_way(way, settings, args.warmup, None)
        for number in range(args.rounds):
            order = ways if number % 2 == 0 else list(reversed(ways))
            for way in order:
                run_way(way, settings, args.jobs, runs)
    finally:
        worker.stop()
        if server is not None:
            server.stop()
    _report(runs, args.jobs, args.concurrency)
    return 0


def _median(runs: list[Run], way: str, value: Callable[[Run], float]) -> float:
    return statistics.median(value(r) for r in runs if r.way == way)


def _report(runs: list[Run], jobs: int, concurrency: int) -> None:
    print(f"{jobs} concurrent invocations of {SKILL}/{TOOL}; one worker, concurrency {concurrency}")
    print(f"{'way':<10} {'jobs/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'client CPU us/job':>18}")
    for run in runs:
        print(
            f"{run.way:<10} {run.jobs_per_s:>8.0f} {run.percentile_ms(0.5):>8.0f} "
            f"{run.percentile_ms(0.99):>8.0f} {run.cpu_us:>18.0f}"
        )
    rate = {w: _median(runs, w, lambda r: r.jobs_per_s) for w in ("async", "sync", "to_thread")}
    p50 = {w: _median(runs, w, lambda r: r.percentile_ms(0.5)) for w in rate}
    cpu = {w: _median(runs, w, lambda r: r.cpu_us) for w in rate}
    for other in ("sync", "to_thread"):
        print(
            f"async vs {other}: throughput x{rate['async'] / rate[other]:.2f}, "
            f"p50 x{p50['async'] / p50[other]:.2f}, client CPU x{cpu['async'] / cpu[other]:.2f}"
        )


if __name__ == "__main__":
    sys.exit(main())
