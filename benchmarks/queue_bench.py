"""Queue benchmark: ``skills.invoke`` of the trivial tool against a plain Celery task.

Run it from the repository root with ``.venv/bin/python benchmarks/queue_bench.py``
(options: ``--jobs 3000``, ``--latency-samples 300``, ``--warmup 30``,
``--rounds 2``, ``--latency-chunks 6``, ``--chunks 1``, ``--redis-url URL``). It
starts a private ``redis-server`` with no persistence on a free port (unless
``--redis-url`` is given) and two workers with identical settings (the same
``celery_settings`` dict: JSON, acks late, prefetch 1, track started, task events
on; prefork pool, concurrency 2, ``--loglevel WARNING --without-mingle
--without-gossip``):

* **skills.invoke**: ``SkillClient.submit("local/common", "local/noop", {})`` then
  ``.result()``, served by ``python -m celery -A worker worker`` with the example
  catalogue (its own queues, ``skills.*``);
* **plain Celery**: ``bench.noop`` (``benchmarks/plain_tasks.py``), a task that
  calls the same function, ``cleveragents.examples.tools.noop``, directly, served by
  ``python -m celery -A benchmarks.plain_tasks worker -Q bench.plain``.

Only one worker runs at a time: the other one is frozen with SIGSTOP (parent and
pool; it runs nothing and takes no message, and the queues are disjoint), and
thawed with SIGCONT when its turn comes, which makes switching free.

For each: round-trip latency (submit, then wait; one at a time; p50 and p99
after a warm-up), and throughput (submit ``--jobs`` invocations as fast as one
client can, then wait for every result; jobs/s from the first submit to the last
result). During the throughput phase it also reads the CPU time used per job by
the worker's parent (the consumer), its pool children, this client process and
the private redis-server (``/proc``). Rounds alternate the order (plain first,
then skills first, ...) since the machine is noisy; the table shows every round
and the median. Within a round the latency samples are taken in
``--latency-chunks`` blocks that alternate plain and skills block by block, which
cancels the slow drift of a shared machine; ``--chunks N`` does the same for
throughput (N runs of ``--jobs``/N each, jobs/s over their summed times); its
default, 1, submits all ``--jobs`` at once. Every process it starts is killed by
its process group at the end, on Ctrl-C or on error. Exit status: 0 when both
targets are met (throughput ratio >= 0.9, p50 latency ratio <= 1.15), 1 when one
is missed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.support.procs import EXAMPLE_SKILLS, RedisServer, kill_group, wait_until  # noqa: E402

CONCURRENCY = 2
SKILL, TOOL = "local/common", "local/noop"
THROUGHPUT_TARGET = 0.9  # skills/plain jobs/s: at least this
LATENCY_TARGET = 1.15  # skills/plain p50 round trip: at most this
KINDS = ("plain", "skills")
LABELS = {"plain": "plain Celery", "skills": "skills.invoke"}


# --------------------------------------------------------------------------- workers


class BenchWorker:
    """One real ``celery worker`` process (its own session, so its group can be killed)."""

    def __init__(self, kind: str, broker_url: str) -> None:
        self.kind = kind
        self.broker_url = broker_url
        self.dir = Path(tempfile.mkdtemp(prefix=f"cleveragents-bench-{kind}-"))
        self.log = self.dir / "worker.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        app, queues = (
            ("benchmarks.plain_tasks", ["-Q", "bench.plain"])
            if self.kind == "plain"
            else ("worker", [])  # the skill worker's own queues (celeryconfig.task_queues)
        )
        return [
            sys.executable,
            "-m",
            "celery",
            "-A",
            app,
            "worker",
            "--pool",
            "prefork",
            "--concurrency",
            str(CONCURRENCY),
            "--loglevel",
            "WARNING",
            "--hostname",
            f"bench-{self.kind}-{os.getpid()}@%h",
            "--without-mingle",
            "--without-gossip",
            *queues,
        ]

    def start(self, timeout: float = 60) -> BenchWorker:
        ready = self.dir / "ready"
        env = {k: v for k, v in os.environ.items() if not k.startswith("CLEVERAGENTS_")}
        env.update(
            CLEVERAGENTS_BROKER_URL=self.broker_url,
            CLEVERAGENTS_CATALOGUE=str(EXAMPLE_SKILLS),
            CLEVERAGENTS_READY_FILE=str(ready),
            PYTHONPATH=str(REPO),
        )
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv(),
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc = self.proc
        wait_until(
            lambda: ready.exists() or proc.poll() is not None, timeout, f"{self.kind} worker"
        )
        if proc.poll() is not None:
            raise RuntimeError(f"{self.kind} worker exited early:\n{self.log_tail()}")
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def pause(self) -> None:
        """Freeze the worker and its pool (SIGSTOP): it runs nothing and takes no message."""
        assert self.proc is not None
        kill_group(self.proc, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        kill_group(self.proc, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            kill_group(self.proc, signal.SIGTERM)  # warm shutdown: nothing is in flight by now
            kill_group(self.proc, signal.SIGCONT)  # a paused worker must wake up to exit
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
        finally:
            kill_group(self.proc, signal.SIGKILL)  # the pool children too, whatever happened
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
            self.proc = None
            shutil.rmtree(self.dir, ignore_errors=True)  # its log was shown if it failed

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""


# --------------------------------------------------------------------------- CPU accounting

_TICK = os.sysconf("SC_CLK_TCK")


def group_cpu_seconds(pgid: int) -> dict[int, float]:
    """User + system CPU seconds of every live process in process group ``pgid``."""
    found: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        # fields[0] is the state (field 3 of proc(5)): pgrp is field 5, utime 14, stime 15.
        if int(fields[2]) == pgid:
            found[int(entry)] = (int(fields[11]) + int(fields[12])) / _TICK
    return found


def self_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass
class CpuSample:
    """CPU seconds used so far by the worker's parent and pool, the client and Redis."""

    worker_parent: float
    worker_pool: float
    client: float
    redis: float

    @classmethod
    def take(cls, worker_pid: int, redis_pid: int | None) -> CpuSample:
        group = group_cpu_seconds(worker_pid)
        redis_cpu = sum(group_cpu_seconds(redis_pid).values()) if redis_pid else 0.0
        return cls(
            worker_parent=group.get(worker_pid, 0.0),
            worker_pool=sum(v for pid, v in group.items() if pid != worker_pid),
            client=self_cpu_seconds(),
            redis=redis_cpu,
        )

    def used_since(self, before: CpuSample) -> dict[str, float]:
        return {
            name: getattr(self, name) - getattr(before, name)
            for name in ("worker_parent", "worker_pool", "client", "redis")
        }


# --------------------------------------------------------------------------- measurements


@dataclass
class Measurement:
    """One kind, one round (its chunks added up)."""

    times: list[float] = field(default_factory=list)  # round trips, seconds
    jobs: int = 0
    elapsed: float = 0.0  # throughput: first submit to last result, summed over chunks
    submitting: float = 0.0  # of which submitting
    cpu_s: dict[str, float] = field(default_factory=dict)  # CPU seconds, by process

    @property
    def p50_ms(self) -> float:
        return statistics.median(self.times) * 1000

    @property
    def p99_ms(self) -> float:
        return statistics.quantiles(self.times, n=100, method="inclusive")[98] * 1000

    @property
    def mean_ms(self) -> float:
        return statistics.fmean(self.times) * 1000

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / self.elapsed

    @property
    def submit_per_s(self) -> float:
        return self.jobs / self.submitting if self.submitting > 0 else float("inf")

    @property
    def cpu_us(self) -> dict[str, float]:
        """CPU microseconds per job of the throughput phase, by process."""
        return {name: value / self.jobs * 1e6 for name, value in self.cpu_s.items()}


@dataclass
class Runner:
    """How to run one invocation of a kind, and many at once."""

    one: Callable[[], None]
    many: Callable[[int], float]  # returns the seconds spent submitting
    close: Callable[[], None] = field(default=lambda: None)


def skills_runner(url: str) -> Runner:
    from cleveragents.client import SkillClient
    from cleveragents.settings import Settings

    client = SkillClient(settings=Settings.from_env({"CLEVERAGENTS_BROKER_URL": url}))

    def one() -> None:
        result = client.submit(SKILL, TOOL, {}).result(timeout=60)
        if not result.success:
            raise RuntimeError(f"skills.invoke failed: {result.error}")

    def many(n: int) -> float:
        start = time.perf_counter()
        handles = [client.submit(SKILL, TOOL, {}) for _ in range(n)]
        submitted = time.perf_counter() - start
        failed = [r for r in (h.result(timeout=300) for h in handles) if not r.success]
        if failed:
            raise RuntimeError(f"{len(failed)} skills.invoke failed, e.g. {failed[0].error}")
        return submitted

    return Runner(one, many, client.close)


def plain_runner(url: str) -> Runner:
    # The app reads celery_settings(Settings.from_env()) at import: the broker is in
    # os.environ by now (main sets it before anything imports plain_tasks).
    from benchmarks import plain_tasks

    task = plain_tasks.noop

    def one() -> None:
        value = task.apply_async().get(timeout=60)
        if value != {"ok": True}:
            raise RuntimeError(f"bench.noop returned {value!r}")

    def many(n: int) -> float:
        start = time.perf_counter()
        results = [task.apply_async() for _ in range(n)]
        submitted = time.perf_counter() - start
        bad = [v for v in (r.get(timeout=300) for r in results) if v != {"ok": True}]
        if bad:
            raise RuntimeError(f"{len(bad)} bench.noop returned {bad[0]!r}")
        return submitted

    return Runner(one, many, plain_tasks.app.close)


def measure_latency(m: Measurement, runner: Runner, samples: int) -> None:
    """Add ``samples`` sequential round trips (submit, then wait) to ``m``."""
    for _ in range(samples):
        start = time.perf_counter()
        runner.one()
        m.times.append(time.perf_counter() - start)


def measure_throughput(
    m: Measurement, runner: Runner, jobs: int, *, worker_pid: int, redis_pid: int | None
) -> None:
    """Add a throughput run of ``jobs`` (submit all, then wait for all) to ``m``."""
    cpu_before = CpuSample.take(worker_pid, redis_pid)
    start = time.perf_counter()
    submitted = runner.many(jobs)
    m.elapsed += time.perf_counter() - start
    cpu_after = CpuSample.take(worker_pid, redis_pid)
    m.submitting += submitted
    m.jobs += jobs
    for name, value in cpu_after.used_since(cpu_before).items():
        m.cpu_s[name] = m.cpu_s.get(name, 0.0) + value


def split(total: int, parts: int) -> list[int]:
    """``total`` in ``parts`` near-equal pieces."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def queue_depths(url: str) -> dict[str, int]:
    import redis

    from cleveragents.constants import QUEUE_BATCH, QUEUE_BATCH_WRITE, QUEUE_READ, QUEUE_WRITE

    client = redis.Redis.from_url(url)
    try:
        names = (QUEUE_READ, QUEUE_WRITE, QUEUE_BATCH, QUEUE_BATCH_WRITE, "bench.plain")
        return {name: int(client.llen(name)) for name in names}  # type: ignore[arg-type]
    finally:
        client.close()


# --------------------------------------------------------------------------- report


def _fmt(value: float, unit: str) -> str:
    if unit in ("jobs/s", "us/job"):
        return f"{value:,.0f} {unit}"
    return f"{value:.2f} {unit}"


_CPU_ROWS = (
    ("worker_parent", "CPU/job: worker parent (consumer)"),
    ("worker_pool", "CPU/job: worker pool (2 children)"),
    ("client", "CPU/job: client (this process)"),
    ("redis", "CPU/job: redis-server"),
)


def report(results: dict[str, list[Measurement]], orders: list[tuple[str, ...]]) -> bool:
    # (label, value of a measurement, unit, target, show every round)
    metrics: list[tuple[str, Callable[[Measurement], float], str, str, bool]] = [
        ("throughput", lambda m: m.jobs_per_s, "jobs/s", f">= {THROUGHPUT_TARGET:g}", True),
        ("latency p50", lambda m: m.p50_ms, "ms", f"<= {LATENCY_TARGET:g}", True),
        ("latency p99", lambda m: m.p99_ms, "ms", "", True),
        ("latency mean", lambda m: m.mean_ms, "ms", "", False),
        ("submit rate (client)", lambda m: m.submit_per_s, "jobs/s", "", False),
    ]
    for key, label in _CPU_ROWS:
        if key == "redis" and not any(m.cpu_s.get("redis") for ms in results.values() for m in ms):
            continue  # a given Redis: its CPU is not ours to read
        metrics.append((label, lambda m, key=key: m.cpu_us[key], "us/job", "", False))
    metrics.append(
        ("CPU/job: all of the above", lambda m: sum(m.cpu_us.values()), "us/job", "", False)
    )
    rows: list[tuple[str, str, str, str, str]] = []
    medians: dict[str, float] = {}
    for label, get, unit, target, per_round in metrics:
        if per_round and len(orders) > 1:
            for index, order in enumerate(orders):
                plain, skills = get(results["plain"][index]), get(results["skills"][index])
                rows.append(
                    (
                        f"{label} [round {index + 1}: {order[0]} first]",
                        _fmt(plain, unit),
                        _fmt(skills, unit),
                        f"{skills / plain:.3f}" if plain else "-",
                        "",
                    )
                )
        plain = statistics.median(get(m) for m in results["plain"])
        skills = statistics.median(get(m) for m in results["skills"])
        ratio = skills / plain if plain else float("nan")
        medians[label] = ratio
        rows.append(
            (
                f"{label} [median]" if len(orders) > 1 else label,
                _fmt(plain, unit),
                _fmt(skills, unit),
                f"{ratio:.3f}" if plain else "-",
                target,
            )
        )
    header = ("metric", LABELS["plain"], LABELS["skills"], "skills/plain", "target")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(row: tuple[str, ...]) -> str:
        first = row[0].ljust(widths[0])
        return "  ".join(
            [first, *(cell.rjust(w) for cell, w in zip(row[1:], widths[1:], strict=True))]
        )

    print()
    print(line(header))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print(line(row))
    throughput, latency = medians["throughput"], medians["latency p50"]
    ok_t, ok_l = throughput >= THROUGHPUT_TARGET, latency <= LATENCY_TARGET
    print()
    print(
        f"throughput ratio {throughput:.3f} (target >= {THROUGHPUT_TARGET:g}): "
        f"{'PASS' if ok_t else 'MISS'}"
    )
    print(
        f"p50 latency ratio {latency:.3f} (target <= {LATENCY_TARGET:g}): "
        f"{'PASS' if ok_l else 'MISS'}"
    )
    return ok_t and ok_l


# --------------------------------------------------------------------------- main


_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """SIGINT (even when inherited as ignored), SIGTERM and SIGHUP unwind like Ctrl-C."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, handler) for sig in _SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@dataclass
class Processes:
    """Everything this run started, killed by process group in ``close``."""

    redis: RedisServer | None = None
    workers: dict[str, BenchWorker] = field(default_factory=dict)
    runners: dict[str, Runner] = field(default_factory=dict)

    def close(self) -> None:
        # No signal may cut the clean-up short: block them until everything is dead.
        signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        try:
            for worker in self.workers.values():
                worker.stop()
            self.workers.clear()
            for runner in self.runners.values():
                with contextlib.suppress(Exception):
                    runner.close()
            if self.redis is not None:
                self.redis.stop()
                shutil.rmtree(self.redis.dir, ignore_errors=True)
                self.redis = None
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)


def run(args: argparse.Namespace, procs: Processes) -> bool:
    if args.redis_url:
        url = args.redis_url
    else:
        procs.redis = RedisServer(persistence=False)
        procs.redis.start()
        url = procs.redis.url
    redis_pid = procs.redis.proc.pid if procs.redis and procs.redis.proc else None
    # Before any settings are read: the same settings on every side, and no embedded
    # broker folder created by accident.
    for name in [n for n in os.environ if n.startswith("CLEVERAGENTS_")]:
        del os.environ[name]
    os.environ["CLEVERAGENTS_BROKER_URL"] = url
    busy = {q: n for q, n in queue_depths(url).items() if n}
    if busy:
        raise SystemExit(f"queues are not empty: {busy}; use an idle Redis")
    procs.runners = {"plain": plain_runner(url), "skills": skills_runner(url)}
    print(
        f"redis {url} ({'private, no persistence' if procs.redis else 'given'}); "
        f"prefork pool, concurrency {CONCURRENCY}, prefetch 1, acks late, events on; "
        f"{args.warmup} warm-up + {args.latency_samples} latency samples "
        f"(in {args.latency_chunks} alternating blocks), {args.jobs} jobs for throughput"
        + (f" (in {args.chunks} alternating runs)" if args.chunks > 1 else "")
        + f", {args.rounds} round{'s' if args.rounds > 1 else ''}",
        flush=True,
    )
    # Both workers are started once; the one not being measured is frozen (SIGSTOP), so
    # only one worker runs at any time, and switching costs nothing: the order can
    # alternate chunk by chunk. Their queues are disjoint (bench.plain / skills.*).
    for kind in KINDS:
        worker = procs.workers[kind] = BenchWorker(kind, url)
        worker.start()
        worker.pause()
    orders = [KINDS if r % 2 == 0 else KINDS[::-1] for r in range(args.rounds)]
    results: dict[str, list[Measurement]] = {kind: [] for kind in KINDS}
    warmed: set[str] = set()

    @contextlib.contextmanager
    def turn(kind: str) -> Iterator[tuple[BenchWorker, Runner]]:
        """Thaw one worker, warm it up (fully the first time), freeze it again after."""
        worker, runner = procs.workers[kind], procs.runners[kind]
        worker.resume()
        try:
            for _ in range(args.warmup if kind not in warmed else min(5, args.warmup)):
                runner.one()
            warmed.add(kind)
            yield worker, runner
        except Exception:
            print(f"{kind} worker log:\n{worker.log_tail()}", file=sys.stderr)
            raise
        worker.pause()

    for index, order in enumerate(orders):
        round_results = {kind: Measurement() for kind in KINDS}
        for samples in split(args.latency_samples, args.latency_chunks):
            for kind in order:
                with turn(kind) as (_, runner):
                    measure_latency(round_results[kind], runner, samples)
        for jobs in split(args.jobs, args.chunks):
            for kind in order:
                with turn(kind) as (worker, runner):
                    measure_throughput(
                        round_results[kind],
                        runner,
                        jobs,
                        worker_pid=worker.pid,
                        redis_pid=redis_pid,
                    )
        for kind in order:
            m = round_results[kind]
            results[kind].append(m)
            print(
                f"round {index + 1}: {LABELS[kind]:<13}  p50 {m.p50_ms:6.2f} ms  "
                f"p99 {m.p99_ms:6.2f} ms  {m.jobs_per_s:7,.0f} jobs/s",
                flush=True,
            )
    return report(results, orders)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=3000, help="invocations for throughput")
    parser.add_argument("--latency-samples", type=int, default=300, help="sequential round trips")
    parser.add_argument("--warmup", type=int, default=30, help="round trips before measuring")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, alternating the order")
    parser.add_argument(
        "--latency-chunks",
        type=int,
        default=6,
        help="take each round's latency samples in this many blocks, alternating plain "
        "and skills block by block (cancels drift on a shared machine)",
    )
    parser.add_argument(
        "--chunks",
        type=int,
        default=1,
        help="split each round's --jobs into this many throughput runs, alternating "
        "plain and skills run by run (default 1: all jobs submitted at once)",
    )
    parser.add_argument(
        "--redis-url",
        help="use this Redis instead of a private one (its skills.* and bench.plain queues "
        "must be empty, and no other worker may consume them)",
    )
    args = parser.parse_args(argv)
    if (
        args.rounds < 1
        or args.chunks < 1
        or args.latency_chunks < 1
        or args.jobs < args.chunks
        or args.latency_samples < max(2, args.latency_chunks)
        or args.warmup < 0
    ):
        parser.error(
            "need --rounds >= 1, --chunks >= 1, --latency-chunks >= 1, --jobs >= --chunks, "
            "--latency-samples >= max(2, --latency-chunks), --warmup >= 0"
        )
    began = time.monotonic()
    procs = Processes()
    with interruptible():
        try:
            passed = run(args, procs)
        except KeyboardInterrupt as exc:
            procs.close()
            print(f"\ninterrupted ({exc}); every process started was killed", file=sys.stderr)
            sys.stdout.flush()
            sys.stderr.flush()
            # Exit now: results still waited for would try, for seconds, to unsubscribe
            # from the Redis that is gone when they are garbage-collected.
            os._exit(130)
        finally:
            procs.close()
    print(f"\ntotal wall time {time.monotonic() - began:.0f} s")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
