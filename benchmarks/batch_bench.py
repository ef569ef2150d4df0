"""Batch throughput, producer memory and fairness, against plain Celery, in one run.

    .venv/bin/python benchmarks/batch_bench.py [--batch 100000] [--plain 3000]
        [--memory-lines 1000000] [--latency-samples 40]

On one private Redis and one worker of two processes (the same settings for both):

1. plain Celery, one task per invocation of the trivial tool (``bench.noop``), jobs/s
   end to end (submit all, wait for all);
2. ``cleveragents batch run`` of --batch invocations of ``local/common local/noop``
   (every result stored under its own request id and written out in order), jobs/s,
   and its ratio to (1): target 10x or more, 15x the aim;
3. the producer's peak memory (max RSS) for a --memory-lines line file: under 200 MB;
4. an interactive invocation's round trip while a batch runs, against idle: under 5x.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.queue_bench import BenchWorker  # noqa: E402
from cleveragents.broker.celery_settings import celery_settings  # noqa: E402
from cleveragents.client import SkillClient  # noqa: E402
from cleveragents.settings import Settings  # noqa: E402
from tests.support.procs import RedisServer  # noqa: E402

SKILL, TOOL = "local/common", "local/noop"


def write_batch(path: Path, lines: int) -> None:
    line = json.dumps({"skill": SKILL, "tool": TOOL, "arguments": {}})
    with path.open("w") as out:
        for _ in range(lines):
            out.write(line + "\n")


def plain_rate(url: str, jobs: int) -> float:
    # Configured from this process's environment (no broker: the embedded default's
    # settings): point every broker and backend setting at the benchmark's Redis.
    from benchmarks.plain_tasks import app, noop

    redis_conf = celery_settings(Settings.from_env({"CLEVERAGENTS_BROKER_URL": url}))
    app.conf.broker_transport = None
    app.conf.broker_url = url
    app.conf.result_backend = url
    app.conf.broker_transport_options = redis_conf["broker_transport_options"]
    started = time.perf_counter()
    results = [noop.apply_async() for _ in range(jobs)]
    for result in results:
        result.get(timeout=300)
    return jobs / (time.perf_counter() - started)


def run_batch(url: str, file: Path, out: Path) -> tuple[float, int, int]:
    """Run ``cleveragents batch run``; return its wall time, exit code and peak RSS (KB)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLEVERAGENTS_")}
    env.update(CLEVERAGENTS_BROKER_URL=url, PYTHONPATH=str(REPO))
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "cleveragents", "batch", "run", str(file), "--out", str(out)],
        env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - started
    return elapsed, os.waitstatus_to_exitcode(status), usage.ru_maxrss


def round_trips(client: SkillClient, samples: int) -> list[float]:
    times = []
    for _ in range(samples):
        started = time.perf_counter()
        result = client.submit(SKILL, TOOL, {}).result(timeout=120)
        times.append((time.perf_counter() - started) * 1000)
        assert result.success, result.error
    return times


def count_lines(path: Path) -> int:
    with path.open("rb") as handle:
        return sum(1 for _ in handle)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--plain", type=int, default=3_000)
    parser.add_argument("--memory-lines", type=int, default=1_000_000)
    parser.add_argument("--latency-samples", type=int, default=40)
    args = parser.parse_args(argv)

    scratch = Path(tempfile.mkdtemp(prefix="cleveragents-batch-bench-"))
    server = RedisServer(persistence=False).start()
    url = server.url
    workers = {kind: BenchWorker(kind, url) for kind in ("plain", "skills")}
    rows: list[tuple[str, str]] = []
    try:
        for worker in workers.values():
            worker.start()
        # 1. plain Celery, one task per invocation
        workers["skills"].pause()
        plain_rate(url, 200)  # warm up
        plain = plain_rate(url, args.plain)
        workers["skills"].resume()
        workers["plain"].pause()
        rows.append(("plain Celery, one task per invocation", f"{plain:,.0f} jobs/s"))

        # 2. the batch path
        batch_file = scratch / "batch.jsonl"
        write_batch(batch_file, args.batch)
        elapsed, code, rss = run_batch(url, batch_file, scratch / "out.jsonl")
        lines = count_lines(scratch / "out.jsonl")
        rate = args.batch / elapsed
        rows.append((f"batch run, {args.batch:,} invocations (exit {code}, {lines:,} lines out)",
                     f"{rate:,.0f} jobs/s"))
        rows.append(("batch / plain", f"{rate / plain:.1f}x  (target >= 10x, aim 15x)"))
        rows.append(("producer peak RSS, that batch", f"{rss / 1024:.0f} MB"))

        # 4. interactive latency, idle and during a batch
        settings = Settings.from_env({"CLEVERAGENTS_BROKER_URL": url})
        with SkillClient(settings=settings) as client:
            round_trips(client, 10)
            idle = statistics.median(round_trips(client, args.latency_samples))
            busy_file = scratch / "busy.jsonl"
            write_batch(busy_file, max(args.batch, 60_000))
            done = threading.Event()

            def background() -> None:
                run_batch(url, busy_file, scratch / "busy-out.jsonl")
                done.set()

            thread = threading.Thread(target=background, daemon=True)
            thread.start()
            time.sleep(3)  # let the batch fill the queues
            busy_samples = round_trips(client, args.latency_samples)
            still_running = not done.is_set()
            thread.join()
        busy = statistics.median(busy_samples)
        rows.append(("interactive round trip, idle (p50)", f"{idle:.1f} ms"))
        rows.append((f"interactive round trip during a batch (p50, batch still running: "
                     f"{still_running})", f"{busy:.1f} ms"))
        rows.append(("during / idle", f"{busy / idle:.1f}x  (target < 5x)"))
        rows.append(("interactive round trip during a batch (max)",
                     f"{max(busy_samples):.1f} ms"))

        # 3. producer memory over a 1,000,000-line file
        if args.memory_lines:
            big = scratch / "big.jsonl"
            write_batch(big, args.memory_lines)
            elapsed, code, rss = run_batch(url, big, scratch / "big-out.jsonl")
            rows.append((f"batch run, {args.memory_lines:,} lines: producer peak RSS "
                         f"(exit {code}, {args.memory_lines / elapsed:,.0f} jobs/s)",
                         f"{rss / 1024:.0f} MB  (target < 200 MB)"))
    finally:
        for worker in workers.values():
            worker.stop()
        server.stop()

    width = max(len(name) for name, _ in rows)
    print(f"one worker of 2 processes, private Redis; {os.cpu_count()} cores")
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
