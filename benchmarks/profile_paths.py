"""Where an invocation's time goes: producer, transport, worker, store, and round trips.

    .venv/bin/python benchmarks/profile_paths.py [--singles 2000] [--lines 50000]
        [--rate 100] [--no-py-spy]

One private ``redis-server`` and one worker (``celery -A worker worker -c 2``, the
example catalogue), the trivial tool, two paths in turn:

* **single**: a producer process submits ``--singles`` invocations
  (``SkillClient.submit``), then waits for every ``.result()``;
* **batch**: ``cleveragents batch run`` of a ``--lines`` line file;
* **plain** (with ``--paths ...,plain``): plain Celery with its defaults
  (``benchmarks/compare_celery.py``, its own worker), ``apply_async()`` then
  ``.get()`` the same way, for comparison.

For each it reports, per invocation:

* CPU time by role, from ``py-spy record --subprocesses --nonblocking`` (samples
  of the producer, the worker's main process and its pool processes, each stack
  put in one class: **store** (a frame in ``cleveragents/stores``,
  ``cleveragents/pipeline/guard.py`` or ``celery/backends``), else **worker** (the runtime,
  the pipeline, the tasks, the tool, our consumer-side code), else **transport**
  (Celery, kombu, billiard: receiving, dispatching to the pool, tracing, acks);
  everything in the producer is **producer**, its imports apart) and, for Redis,
  ``INFO commandstats`` microseconds split by command into transport and store;
* round trips (requests sent to Redis: a command, or a whole pipeline), counted in
  each process by ``benchmarks/profiling/sitecustomize.py``, by caller;
* Redis commands, from ``INFO commandstats``.

py-spy comes from PyPI (``pip install py-spy``); without it (or with
``--no-py-spy``) the CPU split is left out and the rest is reported. Every process
it starts is killed by its process group at the end.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.compare import Service, clean_env, write_jsonl  # noqa: E402
from benchmarks.queue_bench import group_cpu_seconds, interruptible  # noqa: E402
from tests.support.procs import EXAMPLE_SKILLS, RedisServer, kill_group, wait_until  # noqa: E402

HOOK = REPO / "benchmarks" / "profiling"
SKILL, NOOP = "local/common", "local/noop"
ROLES = ("producer", "consumer", "pool")
CLASSES = ("producer", "transport", "worker", "store")
#: Redis commands that serve the results and the guard; every other one is the transport's.
STORE_COMMANDS = {
    "set", "get", "mget", "setex", "psetex", "del", "unlink", "expire", "pexpire",
    "exists", "evalsha", "eval", "script|load", "setnx", "getdel", "getex",
    "publish", "subscribe", "unsubscribe", "psubscribe", "punsubscribe",
}  # fmt: skip


# --------------------------------------------------------------------------- the producer side


def produce(kind: str, url: str, n: int) -> None:
    """A single-invocation producer (``single``: cleveragents, ``plain``: plain Celery).

    Submits ``n``, then waits for each; prints its own timings as JSON.
    """
    import resource

    if kind == "plain":
        os.environ["COMPARE_CELERY_URL"] = url
        from benchmarks import compare_celery

        def submit() -> Callable[[], bool]:
            sent = compare_celery.noop.apply_async()
            return lambda: sent.get(timeout=600) == {"ok": True}

        close: Callable[[], None] = compare_celery.app.close
    else:
        from cleveragents.client import SkillClient
        from cleveragents.settings import Settings

        client = SkillClient(settings=Settings.from_env({"CLEVERAGENTS_BROKER_URL": url}))

        def submit() -> Callable[[], bool]:
            handle = client.submit(SKILL, NOOP, {})
            return lambda: handle.result(timeout=600).success

        close = client.close
    submit()()  # connections up, imports done
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu0, started = usage.ru_utime + usage.ru_stime, time.perf_counter()
    waits = [submit() for _ in range(n)]
    failed = sum(1 for wait in waits if not wait())
    elapsed = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = usage.ru_utime + usage.ru_stime - cpu0
    close()
    print(json.dumps({"elapsed": elapsed, "cpu": cpu, "failed": failed}))


# --------------------------------------------------------------------------- measurements


@dataclass
class Profile:
    """One path: its wall time, CPU by role and class, round trips, Redis commands."""

    path: str
    n: int
    wall_s: float = 0.0
    cpu_s: dict[str, float] = field(default_factory=dict)  # by role, and redis (/proc)
    #: py-spy samples by (role, class); only their shares are used, scaled to ``cpu_s``.
    samples: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    trips: dict[str, collections.Counter[str]] = field(default_factory=dict)  # role -> caller
    commands: dict[str, tuple[int, int]] = field(default_factory=dict)  # cmd -> (calls, usec)


def read_round_trips(folder: Path) -> dict[int, dict[str, object]]:
    found = {}
    for path in folder.glob("rt-*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        found[int(data["pid"])] = data
    return found


def role_of(data: dict[str, object], worker_pid: int, others: set[int]) -> str | None:
    """Which process it is: the profiled worker's main or pool process, or the producer."""
    if data["pid"] == worker_pid:
        return "consumer"
    if data["ppid"] == worker_pid:
        return "pool"
    if data["pid"] in others or data["ppid"] in others:
        return None  # another worker (frozen meanwhile)
    return "producer"


def commandstats(client: object) -> dict[str, tuple[int, int]]:
    info = client.info("commandstats")  # type: ignore[attr-defined]
    return {
        name.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"])) for name, v in info.items()
    }


def classify(frames: list[str], producer: bool) -> str:
    """The class of one py-spy stack (its frames, root first)."""
    text = ";".join(frames)
    if producer:
        return "startup" if "_find_and_load" in text else "producer"
    if any(
        m in text
        for m in ("cleveragents/stores/", "cleveragents/pipeline/guard.py", "celery/backends/")
    ):
        return "store"
    worker_code = ("cleveragents/", "tasks/", "examples/", "(worker/")
    if any(m in text for m in worker_code):
        return "worker"
    return "transport"


def read_py_spy(path: Path, producer: bool) -> collections.Counter[tuple[str, str]]:
    """Samples by (role, class) in a py-spy raw file (``--subprocesses``)."""
    samples: collections.Counter[tuple[str, str]] = collections.Counter()
    if not path.exists():
        return samples
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        processes = sum(1 for f in frames if f.startswith("process "))
        code = [f for f in frames if not f.startswith("process ")]
        role = "producer" if producer else ("consumer" if processes <= 1 else "pool")
        samples[role, classify(code, producer)] += int(count)
    return samples


def split_cpu(p: Profile) -> dict[str, float]:
    """CPU seconds by class: each role's CPU (/proc) shared out as its py-spy samples are."""
    seconds: dict[str, float] = collections.defaultdict(float)
    for role in ROLES:
        mine = {cls: n for (r, cls), n in p.samples.items() if r == role and cls != "startup"}
        total = sum(mine.values())
        for cls, n in mine.items():
            seconds[cls] += p.cpu_s.get(role, 0.0) * n / total
    return seconds


def py_spy(pid_or_argv: int | list[str], out: Path, rate: float) -> list[str]:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    head = [spy, "record", "--nonblocking", "--rate", str(int(rate)), "--format", "raw"]
    head += ["--output", str(out)]
    if isinstance(pid_or_argv, int):
        return [*head, "--subprocesses", "--pid", str(pid_or_argv)]
    return [*head, "--", *pid_or_argv]


def profile_path(
    path: str,
    args: argparse.Namespace,
    urls: dict[str, str],
    workers: dict[str, Service],
    scratch: Path,
) -> Profile:
    import redis

    rt_dir = scratch / "rt"
    name = "celery" if path == "plain" else "cleveragents"
    url, worker = urls[name], workers[name]
    others = {w.proc.pid for n, w in workers.items() if n != name and w.proc is not None}
    for other, service in workers.items():
        (service.resume if other == name else service.pause)()
    assert worker.proc is not None
    worker_pid = worker.proc.pid
    r = redis.Redis.from_url(url)
    env = clean_env(
        CLEVERAGENTS_BROKER_URL=url,
        BENCH_PROFILE_DIR=str(rt_dir),
        PYTHONPATH=f"{HOOK}{os.pathsep}{REPO}",
    )
    if path in ("single", "plain"):
        n = args.singles
        argv = [sys.executable, str(Path(__file__)), "--produce", url, "--kind", path]
        argv += ["--singles", str(n)]
    else:
        n = args.lines
        file = write_jsonl(scratch / "batch.jsonl", n, NOOP, {})
        argv = [sys.executable, "-m", "cleveragents", "batch", "run", str(file)]
        argv += ["--out", str(scratch / "batch.out")]
    prof = Profile(path, n)
    time.sleep(0.5)  # the round-trip files of the warm-up are written
    before_rt = read_round_trips(rt_dir)
    before_cpu = group_cpu_seconds(worker_pid)
    redis_pid = int(r.info("server")["process_id"])
    before_redis = sum(group_cpu_seconds(redis_pid).values())
    r.config_resetstat()
    spy_worker = None
    if args.py_spy:
        spy_worker = subprocess.Popen(
            py_spy(worker_pid, scratch / f"worker-{path}.txt", args.rate),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        time.sleep(1.0)  # attached
        argv = py_spy(argv, scratch / f"producer-{path}.txt", args.rate)
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    prof.wall_s = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{path} producer exited {done.returncode}:\n{done.stderr[-2000:]}")
    own = None
    if path in ("single", "plain"):
        own = json.loads(next(x for x in done.stdout.splitlines() if x.startswith("{")))
        prof.wall_s = own["elapsed"]  # the producer's own start-up left out
    prof.commands = commandstats(r)
    after_cpu = group_cpu_seconds(worker_pid)
    prof.cpu_s = {
        "consumer": after_cpu.get(worker_pid, 0) - before_cpu.get(worker_pid, 0),
        "pool": sum(v - before_cpu.get(p, 0) for p, v in after_cpu.items() if p != worker_pid),
        "redis": sum(group_cpu_seconds(redis_pid).values()) - before_redis,
    }
    if spy_worker is not None:
        spy_worker.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        try:
            spy_worker.wait(30)
        except subprocess.TimeoutExpired:
            kill_group(spy_worker)
        prof.samples = read_py_spy(scratch / f"worker-{path}.txt", False)
        prof.samples.update(read_py_spy(scratch / f"producer-{path}.txt", True))
    time.sleep(0.5)
    after_rt = read_round_trips(rt_dir)
    producer_cpu = sum(
        float(d["cpu_s"])  # type: ignore[arg-type]
        for pid, d in after_rt.items()
        if pid not in before_rt and role_of(d, worker_pid, others) == "producer"
    )
    if own is not None:
        prof.cpu_s["producer"] = own["cpu"]  # measured by itself, its start-up left out
    else:  # its imports left out, as sampled
        startup = prof.samples["producer", "startup"]
        every = startup + prof.samples["producer", "producer"]
        prof.cpu_s["producer"] = producer_cpu * (1 - startup / every) if every else producer_cpu
    prof.trips = {role: collections.Counter() for role in ROLES}
    for pid, data in after_rt.items():
        role = role_of(data, worker_pid, others)
        if role is None:
            continue
        counts = collections.Counter(data["counts"])  # type: ignore[arg-type]
        if pid in before_rt:
            counts.subtract(collections.Counter(before_rt[pid]["counts"]))  # type: ignore[arg-type]
        prof.trips[role].update(+counts)
    r.close()
    return prof


# --------------------------------------------------------------------------- report


def report(profiles: list[Profile]) -> None:
    print("\nper invocation, trivial tool: wall and CPU in microseconds (CPU of each process")
    print("from /proc, shared out as its py-spy samples are); Redis round trips")
    header = f"{'path':<7} {'wall':>6} " + " ".join(f"{c:>9}" for c in CLASSES)
    header += f" {'redis':>6} {'CPU sum':>8}   round trips: producer / consumer / pool"
    print(header)
    for p in profiles:
        split = split_cpu(p)
        us = {c: split.get(c, 0.0) / p.n * 1e6 for c in CLASSES}
        if not p.samples:  # no py-spy: by process only
            us = {"producer": p.cpu_s["producer"] / p.n * 1e6}
            us["transport"] = p.cpu_s["consumer"] / p.n * 1e6
            us["worker"] = p.cpu_s["pool"] / p.n * 1e6
            us["store"] = float("nan")
        redis_us = p.cpu_s["redis"] / p.n * 1e6
        trips = [sum(p.trips[role].values()) / p.n for role in ROLES]
        cells = " ".join(f"{us[c]:>9.0f}" for c in CLASSES)
        total = sum(v for v in us.values() if v == v) + redis_us
        print(
            f"{p.path:<7} {p.wall_s / p.n * 1e6:>6.0f} {cells} {redis_us:>6.0f} {total:>8.0f}   "
            + " / ".join(f"{t:.2f}" for t in trips)
        )
    for p in profiles:
        print(f"\n{p.path}: {p.n:,} invocations, {p.n / p.wall_s:,.0f} jobs/s")
        print(
            "  CPU by process (/proc), us/invocation: "
            + ", ".join(f"{k} {v / p.n * 1e6:.0f}" for k, v in p.cpu_s.items())
        )
        for role in ("consumer", "pool"):
            mine = {cls: n for (r, cls), n in p.samples.items() if r == role}
            if mine:
                total = sum(mine.values())
                print(
                    f"  py-spy samples, {role}: "
                    + ", ".join(f"{cls} {n / total:.0%}" for cls, n in sorted(mine.items()))
                )
        redis_split = collections.Counter[str]()
        for cmd, (_, usec) in p.commands.items():
            redis_split["store" if cmd in STORE_COMMANDS else "transport"] += usec
        print(
            "  Redis command time (commandstats), us/invocation: "
            + ", ".join(f"{k} {v / p.n:.1f}" for k, v in sorted(redis_split.items()))
        )
        calls = sorted(p.commands.items(), key=lambda kv: -kv[1][0])
        print(
            "  Redis commands/invocation: "
            + ", ".join(f"{cmd} {c / p.n:.2f}" for cmd, (c, _) in calls if c / p.n >= 0.005)
            + f" (total {sum(c for c, _ in p.commands.values()) / p.n:.2f})"
        )
        for role in ROLES:
            counts = p.trips[role]
            top = ", ".join(
                f"{caller} {v / p.n:.2f}" for caller, v in counts.most_common() if v / p.n >= 0.005
            )
            print(f"  round trips/invocation, {role}: {sum(counts.values()) / p.n:.2f}: {top}")


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--singles", type=int, default=2000)
    parser.add_argument("--lines", type=int, default=50_000)
    parser.add_argument("--rate", type=float, default=100.0, help="py-spy samples/s")
    parser.add_argument("--no-py-spy", dest="py_spy", action="store_false")
    parser.add_argument(
        "--paths",
        default="single,batch",
        help="of single, batch and plain (plain Celery's defaults, for comparison)",
    )
    parser.add_argument("--keep", metavar="DIR", help="copy the py-spy files (raw) there")
    parser.add_argument("--produce", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--kind", default="single", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.produce:
        produce(args.kind, args.produce, args.singles)
        return 0
    paths = args.paths.split(",")
    if set(paths) - {"single", "batch", "plain"}:
        parser.error("--paths: of single, batch and plain")
    if args.py_spy and not (
        shutil.which("py-spy") or (Path(sys.executable).parent / "py-spy").exists()
    ):
        print("py-spy is not installed (pip install py-spy): no CPU split")
        args.py_spy = False
    scratch = Path(tempfile.mkdtemp(prefix="cleveragents-profile-"))
    (scratch / "rt").mkdir()
    server = RedisServer(persistence=False).start()
    base = server.url.rsplit("/", 1)[0]
    urls = {"cleveragents": f"{base}/0", "celery": f"{base}/1"}
    hook = {"BENCH_PROFILE_DIR": str(scratch / "rt"), "PYTHONPATH": f"{HOOK}{os.pathsep}{REPO}"}
    python = sys.executable
    workers = {}
    if {"single", "batch"} & set(paths):
        workers["cleveragents"] = Service(
            "cleveragents",
            [python, "-m", "celery", "-A", "worker", "worker", "--concurrency", "2",
             "--loglevel", "WARNING"],
            clean_env(
                CLEVERAGENTS_BROKER_URL=urls["cleveragents"],
                CLEVERAGENTS_CATALOGUE=str(EXAMPLE_SKILLS),
                **hook,
            ),
            scratch,
        )  # fmt: skip
    if "plain" in paths:
        workers["celery"] = Service(
            "celery",
            [python, "-m", "celery", "-A", "benchmarks.compare_celery", "worker",
             "--concurrency", "2", "--loglevel", "WARNING"],
            clean_env(COMPARE_CELERY_URL=urls["celery"], **hook),
            scratch,
        )  # fmt: skip
    profiles = []
    with interruptible():
        try:
            for worker in workers.values():
                worker.start()
            if "cleveragents" in workers:
                from cleveragents.client import SkillClient
                from cleveragents.settings import Settings

                settings = Settings.from_env({"CLEVERAGENTS_BROKER_URL": urls["cleveragents"]})
                with SkillClient(settings=settings) as client:
                    for _ in range(50):  # up and warm
                        client.submit(SKILL, NOOP, {}).result(timeout=60)
            wait_until(lambda: len(list((scratch / "rt").glob("rt-*.json"))) >= 3, 30, "hooks")
            print(f"load {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
            for path in paths:
                profiles.append(profile_path(path, args, urls, workers, scratch))
                print(f"{path}: done in {profiles[-1].wall_s:.1f} s", flush=True)
            if args.keep:
                Path(args.keep).mkdir(parents=True, exist_ok=True)
                for raw in scratch.glob("*-*.txt"):
                    shutil.copy(raw, args.keep)
        except Exception:
            for worker in workers.values():
                print(worker.log_tail(), file=sys.stderr)
            raise
        finally:
            for worker in workers.values():
                worker.stop()
            server.stop()
            shutil.rmtree(server.dir, ignore_errors=True)
            shutil.rmtree(scratch, ignore_errors=True)
    report(profiles)
    print(f"load {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
