"""The metrics exporter's scrape time, and the recorder's cost per invocation.

    .venv/bin/python benchmarks/metrics_bench.py [--tools 200] [--scrapes 50] [--records 200000]

On one private ``redis-server`` (no persistence, a free port):

1. the metric store filled as a fleet with ``--tools`` catalogue tools leaves it: every
   tool's zero series, then invocations of each in every outcome and a few buckets, limit
   waits and approvals;
2. one scrape rendered in process (what ``cleveragents metrics --once`` prints), best and
   median of ``--scrapes``;
3. one scrape over HTTP from a running ``cleveragents metrics`` (what Prometheus does),
   best and median of ``--scrapes``;
4. ``MetricsRecorder.record`` of a finished invocation into an in-memory store, per call
   (best of 5 runs of ``--records`` calls), which must not change with the exporter.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import timeit
import urllib.request
from pathlib import Path

import redis

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from cleveragents.metrics.exporter import render  # noqa: E402
from cleveragents.metrics.recorder import MetricsRecorder  # noqa: E402
from cleveragents.skills import SkillResult  # noqa: E402
from cleveragents.stores import MemoryMetricStore, RedisMetricStore  # noqa: E402
from tests.support.procs import RedisServer, free_port, kill_group, wait_until  # noqa: E402


def fill(url: str, tools: int) -> int:
    """Counts of ``tools`` catalogue tools in the store at ``url``; the number of samples."""
    client = redis.Redis.from_url(url)
    recorder = MetricsRecorder(RedisMetricStore(client))
    names = [(f"bench/skill-{i // 5}", f"bench/tool-{i}") for i in range(tools)]
    recorder.start(names)
    for skill, tool in names:
        for ms in (0.5, 3, 40, 700, 12_000):
            recorder.record(
                SkillResult(skill_name=skill, tool_name=tool, success=True, duration_ms=ms)
            )
        recorder.record_wait(skill, tool, 1.5)
        recorder.record_approval(skill, tool, "parked")
        recorder.record_approval(skill, tool, "approved")
    recorder.flush()
    recorder.close()
    text = render(client)
    client.close()
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def timings(call: object, times: int) -> tuple[float, float]:
    """Best and median milliseconds of ``times`` calls of ``call``."""
    took = []
    for _ in range(times):
        start = time.perf_counter()
        call()  # type: ignore[operator]
        took.append((time.perf_counter() - start) * 1000)
    return min(took), statistics.median(took)


def http_scrapes(url: str, times: int) -> tuple[float, float]:
    port = free_port()
    env = {**os.environ, "CLEVERAGENTS_BROKER_URL": url, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "cleveragents", "metrics", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    target = f"http://127.0.0.1:{port}/metrics"

    def get() -> bytes:
        with urllib.request.urlopen(target, timeout=10) as response:
            return bytes(response.read())

    def up() -> bool:
        try:
            return bool(get())
        except OSError:
            return False

    try:
        wait_until(up, 30, "the exporter")
        return timings(get, times)
    finally:
        kill_group(proc)
        proc.wait(10)


def record_cost(records: int) -> float:
    """Best microseconds per ``MetricsRecorder.record`` call."""
    recorder = MetricsRecorder(MemoryMetricStore())
    result = SkillResult(skill_name="s", tool_name="t", success=True, duration_ms=2.0)
    runs = timeit.repeat(lambda: recorder.record(result), number=records, repeat=5)
    recorder.close()
    return min(runs) / records * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tools", type=int, default=200)
    parser.add_argument("--scrapes", type=int, default=50)
    parser.add_argument("--records", type=int, default=200_000)
    args = parser.parse_args()
    server = RedisServer(persistence=False).start()
    try:
        samples = fill(server.url, args.tools)
        client = redis.Redis.from_url(server.url)
        best, median = timings(lambda: render(client), args.scrapes)
        client.close()
        print(f"{args.tools} tools, {samples} samples per scrape")
        print(f"render in process: best {best:.2f} ms, median {median:.2f} ms")
        best, median = http_scrapes(server.url, args.scrapes)
        print(f"scrape over HTTP:  best {best:.2f} ms, median {median:.2f} ms")
    finally:
        server.stop()
    print(f"MetricsRecorder.record: {record_cost(args.records):.3f} us per call (best of 5)")


if __name__ == "__main__":
    main()
