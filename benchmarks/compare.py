"""cleveragents side by side with plain Celery, Celery chunks and Dramatiq, in one run.

    .venv/bin/python benchmarks/compare.py [--lines 100000] [--singles 3000]
        [--latency-samples 300] [--slow 300 --slow-ms 200] [--rounds 2] [--quick]
        [--systems plain,events,chunks,stored,dramatiq,singles,batch,slow] [--paired 600]
        [--check] [--ablate bind,lookups,schema,deadline,observe,transport] [--redis-commands]

One private ``redis-server`` (no persistence, a free port), one worker per system,
each started as its users start it, with its defaults; the trivial tool
(``cleveragents.examples.tools.noop``) everywhere:

========  ==================================================================  ==========
system    what is measured                                                    baseline
========  ==================================================================  ==========
plain     plain Celery, every setting a default (``benchmarks/compare_celery.py``;  -
          ``celery -A benchmarks.compare_celery worker -c 2``): ``--singles``
          ``noop.apply_async()`` then every ``.get()``; round trips one at a time
events    the same worker with its task events on (``enable_events`` by remote     plain
          control, as Flower sends when it starts), measured as ``plain``; not a
          target's baseline: it shows what events cost Celery itself, since
          cleveragents keeps its events on for Flower
chunks    the same worker: ``noop.chunks(zip(range(lines)), 100).apply_async()`` -
          then ``.get()`` (one result per chunk of 100, no per-item result)
stored    the same worker: chunks of 100 written by hand to keep what a batch     chunks
          promises and chunks do not (``noop_stored`` in
          ``benchmarks/compare_celery.py``): each call's result stored under an
          id of its own, read back chunk by chunk (``MGET``) and written to a
          file in order; no input file, no checks. It is how much of the gap
          to chunks that promise alone explains
dramatiq  Dramatiq with its Redis broker and results middleware              plain
          (``benchmarks/compare_dramatiq.py``; ``dramatiq ... --processes 2
          --threads 8``): ``--singles`` ``noop.send()`` then every
          ``get_result(block=True)``; round trips one at a time
singles   cleveragents, ``celery -A worker worker -c 2`` with the example       plain
          catalogue: ``--singles`` ``SkillClient.submit(...)`` then every
          ``.result()``; round trips one at a time
batch     the same worker: ``cleveragents batch run`` of a ``--lines`` line      chunks
          JSONL file (every result stored, written out in input order); wall
          time of the command, its start-up included
slow      the same worker: ``cleveragents batch run`` of ``--slow`` lines of     ideal time
          ``local/sleep`` for ``--slow-ms``; its time against the ideal
          (lines x ms / 2 processes)
========  ==================================================================  ==========

Each system has its own Redis database (cleveragents 0, Celery 1, Dramatiq 2) on
the one server. Only one worker runs at a time: the others are frozen (SIGSTOP of
their process group; idle, nothing in flight) and thawed when their turn comes.
Each turn starts with a few round trips to warm up. Rounds reverse the order of
the systems, since the machine is noisy; compare ratios taken in one round, never
absolute numbers across runs. Dramatiq is an extra (``pip install -e ".[bench]"``):
without it that row is skipped.

Round trips one at a time are measured twice. In each round, as above; then, when
plain and singles are both wanted, **paired**: both workers thawed, one round trip
of each system in turn (``--paired`` pairs, the order flipped every pair), and with
events wanted the same again with plain Celery's task events on. On a virtual
machine whose speed drifts by half within a minute, only paired samples share their
moment: the p50 target is judged on them (the rounds' ratios are printed too).

Beside each row, what Redis spent on it: the private ``redis-server``'s CPU
(``INFO cpu``: used_cpu_sys + used_cpu_user) and its commands (``INFO commandstats``,
the commands a script runs counted too) read before and after each measurement,
per invocation (the round trips one at a time included, its own ``INFO`` left
out), and the ceiling that sets per Redis core: 1e6 / microseconds per
invocation, invocations a second however many workers there are. Commands are
deterministic; CPU, like the rates, is compared within a round. And what each
invocation leaves in Redis until its results expire: ``used_memory`` and keys
(``INFO memory``, ``INFO keyspace``) after less before (docs/operations.md,
"Sizing Redis").
``--redis-commands`` adds each system's commands per invocation, command by command.

Targets (issue 34, every promise kept): batch >= 0.6x chunks and >= 0.7x the stored
row; singles >= 0.9x plain jobs/s and p50 <= 1.15x plain's (paired); Redis CPU per
single invocation <= plain Celery's, per batch line <= 12 us; slow <= 1.2x its ideal
time. The exit status is 0 unless a run
failed, or, with ``--check``, a target was missed in the median of the rounds.
Every process it starts is killed by its process group at the end, on Ctrl-C or
on error.

``--ablate`` prices the worker's promises: the cleveragents processes (worker and
``batch run``) run with the named ones left out (``benchmarks/ablate/sitecustomize.py``),
and their rows say so. Such a run is not the product; it only shows what is left of
the gap to Celery without them.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.queue_bench import interruptible  # noqa: E402
from tests.support.procs import EXAMPLE_SKILLS, RedisServer, kill_group  # noqa: E402

CONCURRENCY = 2  # pool processes of every worker (Dramatiq: processes, of 8 threads each)
DRAMATIQ_THREADS = 8
CHUNK = 100  # Celery chunks of this many calls
ABLATE_DIR = REPO / "benchmarks" / "ablate"  # its sitecustomize, first on PYTHONPATH
SKILL, NOOP, SLEEP = "local/common", "local/noop", "local/sleep"
DB = {"cleveragents": 0, "celery": 1, "dramatiq": 2}

SYSTEMS = ("plain", "events", "dramatiq", "singles", "chunks", "stored", "batch", "slow")
LABELS = {
    "plain": "plain Celery (defaults): apply_async + get",
    "events": "plain Celery, task events on (as Flower turns them on)",
    "dramatiq": f"Dramatiq ({CONCURRENCY} processes x {DRAMATIQ_THREADS} threads): send + result",
    "singles": "cleveragents SkillClient.submit().result()",
    "chunks": f"Celery chunks(..., {CHUNK}): apply_async + get",
    "stored": f"Celery chunks of {CHUNK}, each result stored and written in order",
    "batch": "cleveragents batch run",
    "slow": "cleveragents batch run, slow tool",
}
BASELINE = {
    "events": "plain",
    "dramatiq": "plain",
    "singles": "plain",
    "stored": "chunks",
    "batch": "chunks",
}
WORKER_OF = {
    "plain": "celery",
    "events": "celery",
    "chunks": "celery",
    "stored": "celery",
    "dramatiq": "dramatiq",
    "singles": "cleveragents",
    "batch": "cleveragents",
    "slow": "cleveragents",
}
ABLATIONS = ("bind", "lookups", "schema", "deadline", "observe", "transport")  # --ablate
SINGLES_TARGET = 0.9  # singles / plain, jobs/s: at least this
BATCH_TARGET = 0.6  # batch / chunks, jobs/s: at least this
STORED_TARGET = 0.7  # batch / stored, jobs/s: at least this
REDIS_LINE_US_TARGET = 12.0  # Redis CPU per batch line, us: at most this (singles: plain's)
LATENCY_TARGET = 1.15  # singles / plain, p50 round trip: at most this
SLOW_TARGET = 1.2  # slow batch time / ideal time: at most this


# --------------------------------------------------------------------------- processes


class Service:
    """One worker command in its own session: started, frozen, thawed, killed by group."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], scratch: Path) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.log = scratch / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Service:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=REPO,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def check(self) -> None:
        """Raise with its log when it has exited."""
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} worker exited:\n{self.log_tail()}")

    def pause(self) -> None:
        if self.proc is not None:
            kill_group(self.proc, signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None:
            kill_group(self.proc, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            kill_group(self.proc, signal.SIGTERM)
            kill_group(self.proc, signal.SIGCONT)  # a frozen worker must wake up to exit
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
        finally:
            kill_group(self.proc, signal.SIGKILL)  # its children too, whatever happened
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
            self.proc = None

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any CLEVERAGENTS_/COMPARE_ setting, plus ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CLEVERAGENTS_", "COMPARE_", "CELERY_"))
    }
    env["PYTHONPATH"] = str(REPO)
    if env.get("BENCH_ABLATE"):  # only cleveragents modules are changed
        env["PYTHONPATH"] = f"{ABLATE_DIR}{os.pathsep}{REPO}"
    env.update(extra)
    return env


def services(
    url: dict[str, str], wanted: set[str], scratch: Path, otel: dict[str, str] | None = None
) -> dict[str, Service]:
    """The workers of the systems in ``wanted``, as their users start them (``otel``: the
    cleveragents worker's OpenTelemetry variables, with ``--trace-sample``)."""
    python = sys.executable
    found: dict[str, Service] = {}
    workers = {WORKER_OF[s] for s in wanted}
    if "celery" in workers:
        found["celery"] = Service(
            "celery",
            [python, "-m", "celery", "-A", "benchmarks.compare_celery", "worker",
             "--concurrency", str(CONCURRENCY), "--loglevel", "WARNING"],
            clean_env(COMPARE_CELERY_URL=url["celery"]),
            scratch,
        )  # fmt: skip
    if "dramatiq" in workers:
        found["dramatiq"] = Service(
            "dramatiq",
            [python, "-m", "dramatiq", "benchmarks.compare_dramatiq",
             "--processes", str(CONCURRENCY), "--threads", str(DRAMATIQ_THREADS)],
            clean_env(COMPARE_DRAMATIQ_URL=url["dramatiq"]),
            scratch,
        )  # fmt: skip
    if "cleveragents" in workers:
        found["cleveragents"] = Service(
            "cleveragents",
            [python, "-m", "celery", "-A", "worker", "worker",
             "--concurrency", str(CONCURRENCY), "--loglevel", "WARNING"],
            clean_env(
                CLEVERAGENTS_BROKER_URL=url["cleveragents"],
                CLEVERAGENTS_CATALOGUE=str(EXAMPLE_SKILLS),
                **(otel or {}),
            ),
            scratch,
        )  # fmt: skip
    return found


# --------------------------------------------------------------------------- systems


@dataclass
class Run:
    """One system in one round."""

    jobs: int = 0
    elapsed: float = 0.0  # seconds, first submit to last result
    times: list[float] = field(default_factory=list)  # sequential round trips, seconds
    ideal: float = 0.0  # slow: the time with every process busy all along
    redis: RedisUse | None = None  # what Redis did for the whole measurement

    @property
    def rate(self) -> float:
        return self.jobs / self.elapsed

    @property
    def invocations(self) -> int:
        """Every invocation of the measurement: the round trips one at a time too."""
        return self.jobs + len(self.times)

    def percentile_ms(self, q: int) -> float:
        if len(self.times) < 2:
            return self.times[0] * 1000 if self.times else float("nan")
        return statistics.quantiles(self.times, n=100, method="inclusive")[q - 1] * 1000

    def redis_us(self) -> float:
        """Microseconds of the redis-server's CPU per invocation."""
        return self.redis.cpu_s * 1e6 / self.invocations if self.redis else float("nan")

    def redis_bytes(self) -> float:
        """Bytes of Redis memory each invocation left behind (results, ids, claims: until
        they expire)."""
        return self.redis.memory / self.invocations if self.redis else float("nan")

    def redis_keys(self) -> float:
        """Keys each invocation left behind."""
        return self.redis.keys / self.invocations if self.redis else float("nan")

    def redis_commands(self) -> float:
        """Redis commands per invocation (those a script runs included)."""
        return sum(self.redis.commands.values()) / self.invocations if self.redis else float("nan")


@dataclass
class RedisUse:
    """The private redis-server's CPU (``INFO cpu``: used_cpu_sys + used_cpu_user) and
    commands (``INFO commandstats``: calls by command, those scripts run included)."""

    cpu_s: float
    commands: dict[str, int]
    usec: dict[str, int] = field(default_factory=dict)  # commandstats' time in each command
    memory: int = 0  # INFO memory used_memory: what the invocations left stored
    keys: int = 0  # INFO keyspace: keys of every database

    @classmethod
    def read(cls, client: Any) -> RedisUse:
        cpu = client.info("cpu")
        stats = client.info("commandstats")
        keyspace = client.info("keyspace")
        return cls(
            float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]),
            {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()},
            {name.removeprefix("cmdstat_"): int(v["usec"]) for name, v in stats.items()},
            int(client.info("memory")["used_memory"]),
            sum(int(db["keys"]) for db in keyspace.values()),
        )

    def since(self, before: RedisUse) -> RedisUse:
        """What Redis did between ``before`` and this reading (its own ``INFO`` left out)."""
        names = [
            name
            for name, calls in self.commands.items()
            if name != "info" and calls > before.commands.get(name, 0)
        ]
        return RedisUse(
            self.cpu_s - before.cpu_s,
            {name: self.commands[name] - before.commands.get(name, 0) for name in names},
            {name: self.usec.get(name, 0) - before.usec.get(name, 0) for name in names},
            self.memory - before.memory,
            self.keys - before.keys,
        )


def ceiling(us_per_invocation: float) -> float:
    """Invocations a second that one Redis core serves at this CPU per invocation."""
    return 1e6 / us_per_invocation if us_per_invocation > 0 else float("nan")


@dataclass
class System:
    """How to warm a system up, time its round trips, and measure one round of it."""

    one: Callable[[], None]
    measure: Callable[[int], Run]  # the round's index -> its measurement
    samples: int = 0  # round trips one at a time, before the throughput run
    close: Callable[[], None] = field(default=lambda: None)


def timed_round_trips(one: Callable[[], None], samples: int) -> list[float]:
    times = []
    for _ in range(samples):
        started = time.perf_counter()
        one()
        times.append(time.perf_counter() - started)
    return times


def paired_round_trips(
    first: Callable[[], None], second: Callable[[], None], pairs: int
) -> tuple[list[float], list[float]]:
    """Round trips of two systems in turn, the order flipped every pair: each pair
    shares its moment of a machine whose speed drifts."""
    times: tuple[list[float], list[float]] = ([], [])
    calls = (first, second)
    for index in range(pairs):
        for which in (0, 1) if index % 2 == 0 else (1, 0):
            started = time.perf_counter()
            calls[which]()
            times[which].append(time.perf_counter() - started)
    return times


def p50_ms(times: list[float]) -> float:
    return statistics.median(times) * 1000


def set_events(on: bool) -> None:
    """Turn the plain Celery worker's task events on or off, as Flower does."""
    from benchmarks import compare_celery

    command = "enable_events" if on else "disable_events"
    if not compare_celery.app.control.broadcast(command, reply=True, timeout=10, limit=1):
        raise RuntimeError(f"the plain Celery worker did not answer {command}")


def celery_systems(url: str, args: argparse.Namespace, scratch: Path) -> list[System]:
    """plain, events, chunks and stored, over one app with Celery's defaults.

    ``events`` is ``plain`` with the worker's task events turned on by remote
    control, as Flower does when it starts (``enable_events``), and off again after.
    """
    os.environ["COMPARE_CELERY_URL"] = url
    from benchmarks import compare_celery

    noop = compare_celery.noop

    def one() -> None:
        if noop.apply_async().get(timeout=60) != {"ok": True}:
            raise RuntimeError("noop returned something else")

    def plain(_: int) -> Run:
        run = Run(jobs=args.singles, times=timed_round_trips(one, args.latency_samples))
        started = time.perf_counter()
        results = [noop.apply_async() for _ in range(args.singles)]
        bad = sum(1 for r in results if r.get(timeout=600) != {"ok": True})
        run.elapsed = time.perf_counter() - started
        if bad:
            raise RuntimeError(f"{bad} plain Celery calls returned something else")
        return run

    def chunks(_: int) -> Run:
        started = time.perf_counter()
        group = noop.chunks(zip(range(args.lines)), CHUNK).apply_async()
        values = group.get(timeout=1800)
        elapsed = time.perf_counter() - started
        got = sum(len(chunk) for chunk in values)
        if got != args.lines:
            raise RuntimeError(f"Celery chunks returned {got} results of {args.lines}")
        group.forget()  # 1,000 results of 100 each: keep the Redis small
        return Run(jobs=args.lines, elapsed=elapsed)

    def events(index: int) -> Run:
        set_events(True)
        try:
            for _ in range(5):
                one()
            return plain(index)
        finally:
            set_events(False)

    def stored(index: int) -> Run:
        ids = [f"stored-{index}-{n}" for n in range(args.lines)]
        out = scratch / f"stored-{index}.jsonl"
        started = time.perf_counter()
        written = stored_chunks(ids, out)
        elapsed = time.perf_counter() - started
        if written != args.lines:
            raise RuntimeError(f"stored chunks wrote {written} results of {args.lines}")
        out.unlink()
        client = compare_celery.app.backend.client
        for start in range(0, len(ids), 1000):  # keep the Redis small
            client.delete(
                *(compare_celery.app.backend.get_key_for_task(i) for i in ids[start : start + 1000])
            )
        return Run(jobs=args.lines, elapsed=elapsed)

    close = compare_celery.app.close
    return [
        System(one, plain, args.latency_samples, close),
        System(one, events, args.latency_samples, close),
        System(one, chunks, 0, close),
        System(one, stored, 0, close),
    ]


def stored_chunks(ids: list[str], out: Path) -> int:
    """Chunks of ``noop_stored``, each chunk's results read back as it is done and
    written to ``out`` in order, one JSON line per id; how many lines were written."""
    from celery import group

    from benchmarks import compare_celery

    backend = compare_celery.app.backend
    parts = [ids[start : start + CHUNK] for start in range(0, len(ids), CHUNK)]
    sent = group(compare_celery.noop_stored.s(part) for part in parts).apply_async()
    written = 0
    with out.open("w") as sink:
        for part, chunk in zip(parts, sent.results, strict=True):
            chunk.get(timeout=1800)
            for raw in backend.client.mget([backend.get_key_for_task(i) for i in part]):
                meta = backend.decode(raw)
                sink.write(json.dumps({**meta["result"], "request_id": meta["task_id"]}) + "\n")
                written += 1
    sent.forget()
    return written


def dramatiq_system(url: str, args: argparse.Namespace) -> System:
    os.environ["COMPARE_DRAMATIQ_URL"] = url
    from benchmarks import compare_dramatiq

    noop = compare_dramatiq.noop

    def one() -> None:
        if noop.send().get_result(block=True, timeout=60_000) != {"ok": True}:
            raise RuntimeError("noop returned something else")

    def measure(_: int) -> Run:
        run = Run(jobs=args.singles, times=timed_round_trips(one, args.latency_samples))
        started = time.perf_counter()
        messages = [noop.send() for _ in range(args.singles)]
        results = [m.get_result(block=True, timeout=600_000) for m in messages]
        run.elapsed = time.perf_counter() - started
        bad = sum(1 for r in results if r != {"ok": True})
        if bad:
            raise RuntimeError(f"{bad} Dramatiq calls returned something else")
        return run

    return System(one, measure, args.latency_samples, compare_dramatiq.broker.close)


def cleveragents_systems(
    url: str, args: argparse.Namespace, scratch: Path
) -> tuple[System, System, System]:
    """singles, batch and slow, over one cleveragents worker."""
    from cleveragents.client import SkillClient
    from cleveragents.settings import Settings

    client = SkillClient(settings=Settings.from_env({"CLEVERAGENTS_BROKER_URL": url}))

    def one() -> None:
        result = client.submit(SKILL, NOOP, {}).result(timeout=60)
        if not result.success:
            raise RuntimeError(f"cleveragents noop failed: {result.error}")

    def singles(_: int) -> Run:
        run = Run(jobs=args.singles, times=timed_round_trips(one, args.latency_samples))
        started = time.perf_counter()
        handles = [client.submit(SKILL, NOOP, {}) for _ in range(args.singles)]
        failed = sum(1 for h in handles if not h.result(timeout=600).success)
        run.elapsed = time.perf_counter() - started
        if failed:
            raise RuntimeError(f"{failed} cleveragents invocations failed")
        return run

    def batch(index: int) -> Run:
        # A file of its own per round: ids are derived from the path, so nothing is reused.
        path = write_jsonl(scratch / f"batch-{index}.jsonl", args.lines, NOOP, {})
        return Run(jobs=args.lines, elapsed=batch_run(url, path, args.lines))

    def slow(index: int) -> Run:
        seconds = args.slow_ms / 1000
        path = write_jsonl(scratch / f"slow-{index}.jsonl", args.slow, SLEEP, {"seconds": seconds})
        elapsed = batch_run(url, path, args.slow)
        return Run(jobs=args.slow, elapsed=elapsed, ideal=args.slow * seconds / CONCURRENCY)

    return (
        System(one, singles, args.latency_samples, client.close),
        System(one, batch),
        System(one, slow),
    )


def write_jsonl(path: Path, lines: int, tool: str, arguments: dict[str, Any]) -> Path:
    line = json.dumps({"skill": SKILL, "tool": tool, "arguments": arguments}) + "\n"
    with path.open("w") as out:
        out.writelines(line for _ in range(lines))
    return path


def batch_run(url: str, path: Path, lines: int) -> float:
    """Wall time of ``cleveragents batch run PATH``; raises unless every line succeeded."""
    out, err = path.with_suffix(".out"), path.with_suffix(".err")
    argv = [sys.executable, "-m", "cleveragents", "batch", "run", str(path), "--out", str(out)]
    started = time.perf_counter()
    with err.open("wb") as stderr:
        code = subprocess.call(
            argv,
            cwd=REPO,
            env=clean_env(CLEVERAGENTS_BROKER_URL=url),
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    elapsed = time.perf_counter() - started
    written = sum(1 for _ in out.open("rb")) if out.exists() else 0
    if code != 0 or written != lines:
        tail = err.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"batch run exited {code} with {written} of {lines} lines:\n{tail}")
    out.unlink()
    path.unlink()
    return elapsed


# --------------------------------------------------------------------------- report


def _rate(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def _rounds(values: list[float], fmt: Callable[[float], str]) -> str:
    return " / ".join(fmt(v) for v in values)


def ratio_of(system: str, run: Run, runs: dict[str, list[Run]], index: int) -> float | None:
    """Jobs/s against the baseline's in the same round (slow: time against its ideal)."""
    if system == "slow":
        return run.elapsed / run.ideal
    base = BASELINE.get(system)
    if base is None or base not in runs:
        return None
    return run.rate / runs[base][index].rate


#: Paired round trips: (baseline's name, its times, singles' times), in measured order.
Paired = list[tuple[str, list[float], list[float]]]


def report(runs: dict[str, list[Run]], args: argparse.Namespace, paired: Paired) -> bool:
    """Print the table; return whether every target met in the median of the rounds
    (the p50 target: on the paired round trips, where they were measured)."""
    rows: list[tuple[str, ...]] = []
    verdicts: list[str] = []
    met = True
    for system in SYSTEMS:
        if system not in runs:
            continue
        done = runs[system]
        label = LABELS[system]
        if args.ablate and WORKER_OF[system] == "cleveragents":
            label += f" [without {args.ablate}]"
        if system == "slow":
            label += f", {args.slow} x {args.slow_ms:g} ms"
        elif system in ("batch", "chunks", "stored"):
            label += f", {args.lines:,} lines" if system == "batch" else f", {args.lines:,} calls"
        else:
            label += f" x {args.singles:,}"
        ratios = [ratio_of(system, run, runs, i) for i, run in enumerate(done)]
        known = [r for r in ratios if r is not None]
        if system == "slow":
            ratio = _rounds(known, lambda r: f"{r:.2f}") + f" x ideal {done[0].ideal:.1f} s"
        elif known:
            ratio = _rounds(known, lambda r: f"{r:.2f}") + f" x {BASELINE[system]}"
        else:
            ratio = "baseline"
        p50, p95 = (
            (_rounds([r.percentile_ms(q) for r in done], lambda v: f"{v:.2f}") for q in (50, 95))
            if done[0].times
            else ("", "")
        )
        rows.append(
            (
                label,
                _rounds([r.rate for r in done], _rate),
                ratio,
                p50,
                p95,
                _rounds([r.redis_us() for r in done], lambda v: f"{v:,.1f}"),
                _rounds([r.redis_commands() for r in done], lambda v: f"{v:.2f}"),
                _rounds([ceiling(r.redis_us()) for r in done], _rate),
                _rounds([r.redis_bytes() for r in done], lambda v: f"{v:,.0f}"),
                _rounds([r.redis_keys() for r in done], lambda v: f"{v:.2f}"),
            )
        )
        # Targets, on the median of the rounds
        if system == "singles" and "plain" in runs:
            rate = statistics.median(known)
            lat = statistics.median(
                r.percentile_ms(50) / p.percentile_ms(50)
                for r, p in zip(done, runs["plain"], strict=True)
            )
            pairs = {name: p50_ms(ours) / p50_ms(base) for name, base, ours in paired}
            judged = pairs.get("plain", lat)
            ours_us = statistics.median(r.redis_us() for r in done)
            plain_us = statistics.median(p.redis_us() for p in runs["plain"])
            ok = rate >= SINGLES_TARGET and judged <= LATENCY_TARGET and ours_us <= plain_us
            met &= ok
            where = "paired" if "plain" in pairs else "rounds"
            verdicts.append(
                f"singles: {rate:.2f}x plain jobs/s (target >= {SINGLES_TARGET:g}), "
                f"p50 {judged:.2f}x plain ({where}; target <= {LATENCY_TARGET:g}), "
                f"Redis {ours_us:,.0f} us against plain's {plain_us:,.0f} (target <= plain's): "
                f"{'PASS' if ok else 'MISS'}"
            )
            for name, base, ours in paired:
                verdicts.append(
                    f"  paired round trips, {len(ours):,} each, in turns: singles p50 "
                    f"{p50_ms(ours):.2f} ms, {name} {p50_ms(base):.2f} ms: "
                    f"{pairs[name]:.2f}x {name}"
                )
            verdicts.append(f"  in the rounds: p50 {lat:.2f}x plain")
            if "events" in runs:  # not a target: plain Celery as Flower users run it
                rate_e = statistics.median(
                    r.rate / e.rate for r, e in zip(done, runs["events"], strict=True)
                )
                lat_e = statistics.median(
                    r.percentile_ms(50) / e.percentile_ms(50)
                    for r, e in zip(done, runs["events"], strict=True)
                )
                verdicts.append(
                    f"singles against plain Celery with task events on: {rate_e:.2f}x jobs/s, "
                    f"p50 {lat_e:.2f}x"
                )
        elif system == "batch" and known:
            rate = statistics.median(known)
            line_us = statistics.median(r.redis_us() for r in done)
            ok = rate >= BATCH_TARGET and line_us <= REDIS_LINE_US_TARGET
            met &= ok
            verdicts.append(
                f"batch: {rate:.2f}x chunks jobs/s (target >= {BATCH_TARGET:g}), Redis "
                f"{line_us:.1f} us a line (target <= {REDIS_LINE_US_TARGET:g}): "
                f"{'PASS' if ok else 'MISS'}"
            )
            if "stored" in runs:  # chunks that keep the per-item promise
                stored = runs["stored"]
                alone = statistics.median(
                    s.rate / c.rate for s, c in zip(stored, runs["chunks"], strict=True)
                )
                ours = statistics.median(b.rate / s.rate for b, s in zip(done, stored, strict=True))
                ok = ours >= STORED_TARGET
                met &= ok
                verdicts.append(
                    f"  chunks that store every result and write it in order: {alone:.2f}x "
                    f"chunks; batch {ours:.2f}x them (target >= {STORED_TARGET:g}): "
                    f"{'PASS' if ok else 'MISS'}"
                )
        elif system == "slow":
            slow = statistics.median(known)
            ok = slow <= SLOW_TARGET
            met &= ok
            verdicts.append(
                f"slow batch: {slow:.2f}x its ideal time (target <= {SLOW_TARGET:g}): "
                f"{'PASS' if ok else 'MISS'}"
            )
    rounds = " / ".join(str(i + 1) for i in range(args.rounds))
    header = (
        "system",
        f"jobs/s (round {rounds})",
        "ratio, same round",
        "p50 ms",
        "p95 ms",
        "Redis CPU us/inv",
        "Redis commands/inv",
        "ceiling inv/s per Redis core",
        "Redis bytes kept/inv",
        "keys kept/inv",
    )
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(row: tuple[str, ...]) -> str:
        cells = [
            row[0].ljust(widths[0]),
            *(c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)),
        ]
        return "  ".join(cells).rstrip()

    print()
    print(line(header))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print(line(row))
    print()
    for verdict in verdicts:
        print(verdict)
    print(
        "Redis columns: the private redis-server's INFO cpu (used_cpu_sys + used_cpu_user) and "
        "INFO commandstats (commands a script runs counted too) over each whole measurement, "
        "round trips one at a time included, per invocation; ceiling = 1e6 / us per invocation; "
        "bytes and keys kept: INFO memory used_memory and INFO keyspace after the measurement "
        "less before (what stays until results expire)"
    )
    return met


def command_table(
    runs: dict[str, list[Run]],
) -> dict[str, dict[str, tuple[float, float]]]:
    """Per system, each Redis command's calls and microseconds (commandstats' time in
    the command) per invocation, all rounds together."""
    table: dict[str, dict[str, tuple[float, float]]] = {}
    for system, done in runs.items():
        invocations = sum(r.invocations for r in done)
        calls: dict[str, int] = {}
        usec: dict[str, int] = {}
        for r in done:
            if r.redis is None:
                continue
            for name, n in r.redis.commands.items():
                calls[name] = calls.get(name, 0) + n
                usec[name] = usec.get(name, 0) + r.redis.usec.get(name, 0)
        table[system] = {
            name: (n / invocations, usec[name] / invocations) for name, n in sorted(calls.items())
        }
    return table


def print_commands(runs: dict[str, list[Run]]) -> None:
    """``--redis-commands``: each system's commands per invocation, command by command
    (calls, and in brackets microseconds in the command: a script's include its own)."""
    table = command_table(runs)
    systems = [s for s in SYSTEMS if s in table]
    names = sorted({n for per in table.values() for n in per})
    width = max([len("command"), *(len(n) for n in names)])
    print()
    print(
        "Redis commands per invocation, calls (us in the command), INFO commandstats; "
        "the commands a script runs are counted too, and their time is also its script's"
    )
    print("command".ljust(width) + "".join(f"{s:>17}" for s in systems))
    for name in [*names, "all"]:
        cells = []
        for s in systems:
            if name == "all":  # times not summed: a script's holds its commands'
                cells.append(f"{sum(c for c, _ in table[s].values()):>8.2f}        ")
                continue
            calls, usec = table[s].get(name, (0.0, 0.0))
            cells.append(f"{calls:>8.3f} ({usec:>5.1f})" if calls else f"{'-':>17}")
        print(name.ljust(width) + "".join(f"{c:>17}" for c in cells))


# --------------------------------------------------------------------------- main


@dataclass
class Everything:
    """What the run started: killed (by process group) and removed in ``close``."""

    scratch: Path
    redis: RedisServer | None = None
    workers: dict[str, Service] = field(default_factory=dict)
    systems: dict[str, System] = field(default_factory=dict)
    sink: Any = None  # the trace sink of --trace-sample

    def close(self) -> None:
        signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        signal.pthread_sigmask(signal.SIG_BLOCK, signals)  # nothing cuts the clean-up short
        try:
            for worker in self.workers.values():
                worker.stop()
            self.workers.clear()
            for system in self.systems.values():
                with contextlib.suppress(Exception):
                    system.close()
            self.systems.clear()
            if self.redis is not None:
                self.redis.stop()
                shutil.rmtree(self.redis.dir, ignore_errors=True)
                self.redis = None
            shutil.rmtree(self.scratch, ignore_errors=True)
            if self.sink is not None:
                self.sink.close()
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)


def run(args: argparse.Namespace, wanted: list[str], every: Everything) -> bool:
    every.redis = RedisServer(persistence=False).start()
    base = every.redis.url.rsplit("/", 1)[0]
    url = {name: f"{base}/{db}" for name, db in DB.items()}
    for name in [n for n in os.environ if n.startswith("CLEVERAGENTS_")]:
        del os.environ[name]  # the client reads only what this run gives it
    otel = None
    if args.trace_sample is not None:
        from benchmarks.trace_sink import TraceSink

        every.sink = TraceSink()
        otel = every.sink.env(args.trace_sample)
        print(f"cleveragents worker traces, sampling {args.trace_sample:g}", flush=True)
    every.workers = services(url, set(wanted), every.scratch, otel)
    for worker in every.workers.values():
        worker.start()
    if {"plain", "events", "chunks", "stored"} & set(wanted):
        plain, events, chunks, stored = celery_systems(url["celery"], args, every.scratch)
        every.systems.update(plain=plain, events=events, chunks=chunks, stored=stored)
    if "dramatiq" in wanted:
        every.systems["dramatiq"] = dramatiq_system(url["dramatiq"], args)
    if {"singles", "batch", "slow"} & set(wanted):
        singles, batch, slow = cleveragents_systems(url["cleveragents"], args, every.scratch)
        every.systems.update(singles=singles, batch=batch, slow=slow)
    # Up and warm (the first round trips wait for the worker to start), then frozen.
    for name, worker in every.workers.items():
        system = next(every.systems[s] for s in wanted if WORKER_OF[s] == name)
        try:
            for _ in range(args.warmup):
                system.one()
        except Exception:
            worker.check()
            raise
        worker.pause()
    load = os.getloadavg()[0]
    print(
        f"redis {base} (private, no persistence); one worker of {CONCURRENCY} processes per "
        f"system, the others frozen; {args.rounds} round(s), order reversed each round; "
        f"load {load:.2f} on {os.cpu_count()} cores",
        flush=True,
    )
    if "batch" in wanted or "slow" in wanted:
        every.workers["cleveragents"].resume()
        started = time.perf_counter()
        batch_run(url["cleveragents"], write_jsonl(every.scratch / "one.jsonl", 1, NOOP, {}), 1)
        print(
            f"(cleveragents batch run of 1 line, its start-up: "
            f"{time.perf_counter() - started:.2f} s, included in the batch rows)",
            flush=True,
        )
        every.workers["cleveragents"].pause()

    import redis

    server = redis.Redis.from_url(every.redis.url)  # INFO is the server's, whatever the db
    runs: dict[str, list[Run]] = {}
    for index in range(args.rounds):
        order = wanted if index % 2 == 0 else wanted[::-1]
        for system_name in order:
            worker = every.workers[WORKER_OF[system_name]]
            system = every.systems[system_name]
            worker.resume()
            try:
                for _ in range(min(5, args.warmup)):
                    system.one()
                before = RedisUse.read(server)
                result = system.measure(index)
                result.redis = RedisUse.read(server).since(before)
            except Exception:
                print(f"{system_name}: worker log:\n{worker.log_tail()}", file=sys.stderr)
                raise
            worker.pause()
            runs.setdefault(system_name, []).append(result)
            extra = (
                f"  p50 {result.percentile_ms(50):.2f} ms  p95 {result.percentile_ms(95):.2f} ms"
                if result.times
                else ""
            )
            print(
                f"round {index + 1}: {system_name:<8} {result.jobs:>7,} jobs "
                f"{result.elapsed:7.2f} s  {_rate(result.rate):>7} jobs/s{extra}  Redis "
                f"{result.redis_us():.1f} us, {result.redis_commands():.2f} commands "
                f"per invocation",
                flush=True,
            )
    paired = measure_paired(args, wanted, every)
    met = report(runs, args, paired)
    if args.redis_commands:
        print_commands(runs)
    if every.sink is not None:
        print(f"trace exports received: {every.sink.exports} ({every.sink.bytes:,} bytes)")
    print(f"load {os.getloadavg()[0]:.2f} at the end")
    return met


def measure_paired(args: argparse.Namespace, wanted: list[str], every: Everything) -> Paired:
    """Singles against plain Celery (and with its events on), one round trip each in turn."""
    if args.paired < 1 or not {"plain", "singles"} <= set(wanted):
        return []
    plain, singles = every.systems["plain"].one, every.systems["singles"].one
    workers = [every.workers["celery"], every.workers["cleveragents"]]
    for worker in workers:
        worker.resume()
    try:
        out: Paired = []
        for name in ("plain", "events"):
            if name not in wanted:
                continue
            set_events(name == "events")
            paired_round_trips(plain, singles, min(10, args.warmup))
            base, ours = paired_round_trips(plain, singles, args.paired)
            out.append((name, base, ours))
            print(
                f"paired: {name:<8} p50 {p50_ms(base):.2f} ms, singles p50 "
                f"{p50_ms(ours):.2f} ms ({args.paired:,} each, in turns)",
                flush=True,
            )
        return out
    finally:
        set_events(False)
        for worker in workers:
            worker.pause()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--lines", type=int, help="batch lines and chunked calls (100000)")
    parser.add_argument("--singles", type=int, help="single invocations per system (3000)")
    parser.add_argument("--latency-samples", type=int, help="round trips one at a time (300)")
    parser.add_argument("--slow", type=int, help="lines of the slow batch (300; 0: none)")
    parser.add_argument("--slow-ms", type=float, default=200.0, help="its tool's time (200)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, order reversed (2)")
    parser.add_argument("--warmup", type=int, help="round trips before the first round (30)")
    parser.add_argument(
        "--quick", action="store_true", help="small sizes for a smoke run (every size above)"
    )
    parser.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help=f"comma-separated, of {','.join(SYSTEMS)} (default: all; dramatiq is "
        "skipped when not installed)",
    )
    parser.add_argument(
        "--paired", type=int, help="round trips of plain and singles in turns (600; 0: none)"
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument(
        "--redis-commands",
        action="store_true",
        help="also print each system's Redis commands per invocation, command by command",
    )
    parser.add_argument(
        "--trace-sample",
        type=float,
        default=None,
        metavar="RATIO",
        help="the cleveragents worker traces (the otel extra), sampling RATIO of the traces "
        "(0.01: 1%%), exporting over OTLP/HTTP to a local sink",
    )
    parser.add_argument(
        "--ablate",
        default="",
        help="leave these promises out of cleveragents, to price them: comma-separated, of "
        "bind,lookups,schema,deadline,observe,transport (benchmarks/ablate/sitecustomize.py)",
    )
    args = parser.parse_args(argv)
    unknown_ablations = set(filter(None, args.ablate.split(","))) - set(ABLATIONS)
    if unknown_ablations:
        parser.error(f"--ablate: unknown {sorted(unknown_ablations)}")
    if args.ablate:
        os.environ["BENCH_ABLATE"] = args.ablate  # for the processes it starts
    else:
        os.environ.pop("BENCH_ABLATE", None)
    sizes = (
        {"lines": 2000, "singles": 200, "latency_samples": 30, "slow": 8, "warmup": 3, "paired": 20}
        if args.quick
        else {
            "lines": 100_000,
            "singles": 3000,
            "latency_samples": 300,
            "slow": 300,
            "warmup": 30,
            "paired": 600,
        }
    )
    for name, value in sizes.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    wanted = [s for s in SYSTEMS if s in args.systems.split(",")]
    unknown = set(args.systems.split(",")) - set(SYSTEMS)
    if unknown or not wanted or args.rounds < 1 or args.lines < 1 or args.singles < 1:
        parser.error(f"need known systems ({unknown or 'none given'}), sizes >= 1")
    if "dramatiq" in wanted and importlib.util.find_spec("dramatiq") is None:
        print('dramatiq is not installed (pip install -e ".[bench]"): skipped')
        wanted.remove("dramatiq")
    if args.slow < 1 and "slow" in wanted:
        wanted.remove("slow")
    began = time.monotonic()
    every = Everything(Path(tempfile.mkdtemp(prefix="cleveragents-compare-")))
    with interruptible():
        try:
            met = run(args, wanted, every)
        except KeyboardInterrupt as exc:
            every.close()
            print(f"\ninterrupted ({exc}); every process started was killed", file=sys.stderr)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(130)  # waiting results would try to unsubscribe from a Redis now gone
        finally:
            every.close()
    print(f"total wall time {time.monotonic() - began:.0f} s")
    return 1 if args.check and not met else 0


if __name__ == "__main__":
    sys.exit(main())
