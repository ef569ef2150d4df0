"""Fault table: every fault scenario of tests/faults/test_faults.py, larger and several times.

Each run gets its own private redis-server (AOF, ``appendfsync always``, a free
port) and real worker processes, killed and restarted by PID, exactly as in the
tests (the scenarios are the tests' own functions). Prints one row per scenario:

* invocations: per run;
* lost: requests without a stored result at the end, over all runs;
* dup exec (write / other): executions beyond one per request id, counted by the
  tools themselves, of non-idempotent writes / of reads and idempotent writes;
* interrupted: writes answered ``write_interrupted`` (may or may not have run);
* failed: other failed results (poison messages, and what was finished with them);
* recover s: median and worst, as each scenario defines it (below); "-" when a run
  never recovered within its deadline.

Rows 7 to 10 are hostile tools (``benchmarks/hostile_rows.py``): there ``fail``
counts outcomes other than the expected failure.

Usage: python benchmarks/fault_table.py [--runs 3] [--scale 1.0] [--skip-slow] [--only TEXT]
       [--broker redis|rabbitmq]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.hostile_rows import rows as hostile_rows  # noqa: E402
from tests.support.fault_rig import (  # noqa: E402
    IDEMPOTENT,
    READ,
    RECOVERY_S,
    VISIBILITY_S,
    WRITE,
    Outcome,
    Rig,
    reason,
    rig,
)
from tests.support.fault_scenarios import (  # noqa: E402
    scenario_child_kill_mid_tool,
    scenario_child_kills_under_load,
    scenario_duplicate_submission,
    scenario_frozen_worker,
    scenario_outlive_visibility,
    scenario_poison,
    scenario_poison_in_batch,
    scenario_redis_outage,
    scenario_redis_restart,
    scenario_reply_lost_in_flight,
    scenario_worker_kill,
)
from tests.support.rabbit import Rabbit  # noqa: E402

Scenario = Callable[[Rig], Outcome]
#: Rows that run on RabbitMQ too: workers, writes and poison (not Redis's own faults,
#: nor kombu's Redis fetch, nor the hostile tools, which do not depend on the broker).
RABBITMQ_ROWS = ("1 ", "2 ", "5 ", "6 ")
#: A row's visibility timeout of None: the rig leaves it, and the recovery time, at
#: their defaults (900 s and 30 s); else the recovery time is the rig's RECOVERY_S.
DEFAULTS = None


def child_kill_each_tool(r: Rig) -> Outcome:
    seen = scenario_child_kill_mid_tool(r, tools=(READ, IDEMPOTENT, WRITE))
    outcome = Outcome("child SIGKILL mid-tool, one of each kind", 3)
    for tool, info in seen.items():
        runs = len(info["pids"])
        result = info["stored"]
        if result is None:
            outcome.lost += 1
        elif tool == WRITE:
            outcome.write_dupes += max(0, runs - 1)
            outcome.interrupted += reason(result) == "write_interrupted"
        else:
            outcome.other_dupes += max(0, runs - 1)
            outcome.failed += not result.success
        outcome.recover_s = info["recover_s"]
    return outcome


def duplicates(r: Rig) -> Outcome:
    seen = scenario_duplicate_submission(r, copies=4, sleep_s=2.0, concurrency=2)
    outcome = Outcome("same write id submitted 4x while it runs", 1)
    final = seen["final"]
    outcome.lost = int(final is None)
    outcome.write_dupes = max(0, seen["runs"] - 1)
    outcome.failed = int(final is not None and (not final.success or final != seen["first_seen"]))
    return outcome


def outlive_visibility(r: Rig) -> Outcome:
    started = time.monotonic()
    seen = scenario_outlive_visibility(r, sleep_s=7.0)
    outcome = Outcome(f"write sleeps 7s, visibility {r.visibility_s}s, live worker", 1)
    outcome.lost = int(seen["final"] is None)
    outcome.write_dupes = max(0, seen["runs"] - 1)
    outcome.failed = int(not seen["result"].success)
    outcome.recover_s = time.monotonic() - started
    outcome.notes.append(f"{seen['deliveries']} deliveries")
    return outcome


def frozen_worker(r: Rig) -> Outcome:
    started = time.monotonic()
    seen = scenario_frozen_worker(r, sleep_s=10.0, frozen_s=30.0)
    outcome = Outcome("write of a worker frozen past its liveness, handed out again", 1)
    outcome.lost = int(seen["final"] is None)
    outcome.write_dupes = max(0, seen["runs"] - 1)
    outcome.failed = int(not seen["result"].success or seen["final"] != seen["result"])
    outcome.recover_s = time.monotonic() - started
    outcome.notes.append(f"{seen['deliveries']} deliveries, {seen['counted']} counted")
    return outcome


def poison(r: Rig) -> Outcome:
    seen = scenario_poison(r)
    outcome = Outcome("poison invocation (kills its process)", 1)
    outcome.failed = int(reason(seen["result"]) != "poison_message")
    outcome.recover_s = seen["elapsed_s"]
    outcome.notes.append(f"ran {seen['runs']}x")
    if not seen["served_after"]:
        outcome.notes.append("not served afterwards")
    return outcome


def reply_lost(r: Rig) -> Outcome:
    seen = scenario_reply_lost_in_flight(r, wait_s=VISIBILITY_S + 6)
    outcome = Outcome("connection cut as BRPOP hands over a message", 1)
    outcome.lost = int(seen["result"] is None)
    return outcome


def scenarios(scale: float, skip_slow: bool) -> list[tuple[str, float | None, Scenario]]:
    """(name, visibility timeout or ``DEFAULTS``, scenario) for every row of the table."""

    def n(base: int) -> int:
        return max(30, int(base * scale))

    rows: list[tuple[str, float | None, Scenario]] = [
        ("1 child kill, each tool kind", VISIBILITY_S, child_kill_each_tool),
        (
            "1 child kills under load",
            VISIBILITY_S,
            lambda r: scenario_child_kills_under_load(r, n(300), kills=5, sleep_s=0.03),
        ),
        (
            "2 worker kill (busy), restart after visibility",
            VISIBILITY_S,
            lambda r: scenario_worker_kill(
                r, n(600), restart_after_s=VISIBILITY_S + 0.5, sleep_s=0.02
            ),
        ),
        (
            "2 worker kill (any moment), restart after visibility",
            VISIBILITY_S,
            lambda r: scenario_worker_kill(
                r, n(600), restart_after_s=VISIBILITY_S + 0.5, moment="any", sleep_s=0.02
            ),
        ),
    ]
    if not skip_slow:
        rows.append(
            (
                "2 worker kill (busy), restart at once",
                VISIBILITY_S,
                lambda r: scenario_worker_kill(
                    r, n(600), restart_after_s=0.0, sleep_s=0.02, deadline_s=150
                ),
            )
        )
    rows.append(
        (
            "2 worker kill -9, default settings, new worker at once",
            DEFAULTS,
            lambda r: scenario_worker_kill(
                r, n(600), restart_after_s=0.0, sleep_s=0.02, deadline_s=120
            ),
        )
    )
    rows += [
        (
            "3 redis SIGKILL + restart (busy)",
            VISIBILITY_S,
            lambda r: scenario_redis_restart(r, n(600), down_s=0.0, sleep_s=0.02),
        ),
        (
            "3 redis SIGKILL + restart (any moment)",
            VISIBILITY_S,
            lambda r: scenario_redis_restart(
                r, n(600), down_s=0.0, moment="any", sleep_s=0.02, deadline_s=30
            ),
        ),
        (
            "3 redis SIGTERM, 3s down (busy)",
            VISIBILITY_S,
            lambda r: scenario_redis_restart(
                r, n(600), down_s=3.0, sig=signal.SIGTERM, sleep_s=0.02
            ),
        ),
        (
            "4 redis down 5s, worker idle",
            VISIBILITY_S,
            lambda r: scenario_redis_outage(r, down_s=5.0, busy=False, n=20),
        ),
        (
            "4 redis down 5s, worker busy",
            VISIBILITY_S,
            lambda r: scenario_redis_outage(r, down_s=5.0, busy=True, n=20, deadline_s=15),
        ),
        ("4 fetch reply lost in flight", VISIBILITY_S, reply_lost),
        ("5 write submitted 4x while running", VISIBILITY_S, duplicates),
        ("5 write outlives visibility (2s)", 2.0, outlive_visibility),
        ("5 write of a worker frozen past its liveness", VISIBILITY_S, frozen_worker),
        ("6 poison invocation", VISIBILITY_S, poison),
        (
            "6 poisons in batch chunks",
            VISIBILITY_S,
            lambda r: scenario_poison_in_batch(r, n(300), poisons=3, chunk_size=100),
        ),
    ]
    rows += hostile_rows(VISIBILITY_S)
    return rows


@dataclass
class Row:
    name: str
    outcomes: list[Outcome] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def fmt_recover(outcomes: list[Outcome]) -> str:
    values = [o.recover_s for o in outcomes]
    known = [v for v in values if v is not None]
    if not known:
        return "-"
    text = f"{statistics.median(known):.1f} / {max(known):.1f}"
    missing = len(values) - len(known)
    return text + (f" ({missing}x -)" if missing else "")


def notes_of(row: Row) -> str:
    seen: dict[str, int] = {}
    for outcome in row.outcomes:
        for note in outcome.notes:
            short = note if len(note) < 60 else note[:57] + "..."
            seen[short] = seen.get(short, 0) + 1
        if outcome.client_error:
            short = "client: " + outcome.client_error.split(":")[0]
            seen[short] = seen.get(short, 0) + 1
    for error in row.errors:
        seen[f"run error: {error}"] = seen.get(f"run error: {error}", 0) + 1
    return "; ".join(f"{k} (x{v})" if v > 1 else k for k, v in seen.items())


def print_table(rows: list[Row]) -> None:
    width = max([48, *(len(row.name) for row in rows)])
    header = (
        f"{'scenario':<{width}} {'runs':>4} {'invoc.':>6} {'lost':>5} {'dup w':>5} {'dup o':>5} "
        f"{'intr':>4} {'fail':>4} {'recover s (med/max)':>20}  notes"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        o = row.outcomes
        invocations = max((x.invocations for x in o), default=0)
        print(
            f"{row.name:<{width}} {len(o) + len(row.errors):>4} {invocations:>6} "
            f"{sum(x.lost for x in o):>5} {sum(x.write_dupes for x in o):>5} "
            f"{sum(x.other_dupes for x in o):>5} {sum(x.interrupted for x in o):>4} "
            f"{sum(x.failed for x in o):>4} {fmt_recover(o):>20}  {notes_of(row)}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--scale", type=float, default=1.0, help="invocations multiplier")
    parser.add_argument("--skip-slow", action="store_true", help="skip the ~100 s recovery row")
    parser.add_argument(
        "--only", default="", help="run rows whose name contains this (comma-separated: any)"
    )
    parser.add_argument(
        "--broker",
        choices=("redis", "rabbitmq"),
        default="redis",
        help="the broker of the rows (rabbitmq: a virtual host per run, results in Redis; "
        "only the rows about workers, writes and poison, not those about Redis itself)",
    )
    args = parser.parse_args()
    rabbit = Rabbit() if args.broker == "rabbitmq" else None
    for name in list(os.environ):
        if name.startswith("CLEVERAGENTS_"):
            del os.environ[name]
    rows: list[Row] = []
    started = time.monotonic()
    for name, visibility, scenario in scenarios(args.scale, args.skip_slow):
        if args.only and not any(part in name for part in args.only.split(",")):
            continue
        if rabbit is not None and not name.startswith(RABBITMQ_ROWS):
            continue
        row = Row(name)
        rows.append(row)
        for run in range(args.runs):
            t0 = time.monotonic()
            try:
                with (
                    tempfile.TemporaryDirectory(prefix="fault-table-") as tmp,
                    rabbit.vhost() if rabbit is not None else nullcontext() as broker,
                    rig(
                        Path(tmp) / "rig",
                        visibility_s=visibility,
                        recovery_s=RECOVERY_S if visibility is not DEFAULTS else DEFAULTS,
                        broker=broker,
                    ) as r,
                ):
                    row.outcomes.append(scenario(r))
            except Exception as exc:  # one failed run is a row note, not the end
                row.errors.append(f"{type(exc).__name__}: {str(exc)[:80]}")
                traceback.print_exc(limit=3, file=sys.stderr)
            print(
                f"  {name} run {run + 1}: {time.monotonic() - t0:.1f}s",
                file=sys.stderr,
                flush=True,
            )
    if rabbit is not None:
        rabbit.close()
    print()
    print_table(rows)
    print()
    print(
        "recover s: child kills: last kill -> last result; worker kill: new worker "
        "started -> batch ended;\n  redis restart/outage: redis-server up again -> every "
        "result stored (outage: new submissions);\n  outlives visibility, frozen worker: "
        "submit -> result; poison: submit -> poison result; poisons in batch: batch "
        "duration;\n"
        "  hostile tools (7-10): submit -> results (7: -> new pool processes; 8: -> two 1 s "
        "tools\n  ran side by side)."
    )
    total = time.monotonic() - started
    print(
        f"visibility timeout {VISIBILITY_S:g}s, recovery time {RECOVERY_S:g}s unless the row "
        f"says; total {total:.0f}s"
    )


if __name__ == "__main__":
    main()
