"""The soak across hosts: the multi-host rig under load and chaos for a while, then every
promise counted (``benchmarks/soak.py`` is its one-machine sibling).

    .venv/bin/python benchmarks/soak_hosts.py [--topology redis|sentinel|rabbitmq] [--minutes 30]
        [--hosts 2] [--tls] [--chaos-every 45] [--partition-s 60] [--seed N] [--json] [--keep]

The rig (``tests/support/hosts_rig.py``, network namespaces, needs root): producers on
``prod``; workers on ``--hosts`` worker hosts; on ``redis`` a Redis primary (broker and
results) with a replica, on ``sentinel`` the same with three Sentinels and the fleet on
``sentinel://`` URLs (no TLS), on ``rabbitmq`` a three-node RabbitMQ cluster (quorum
queues) with Redis for results; ``--tls``: ``rediss://`` between hosts with a CA the rig
makes.
The producers (``tests/support/hosts_load.py``) send a stream of single writes (a third
of them take 1.5 s) and a batch of mixed lines every ``--batch-every`` seconds. Every
``--chaos-every`` seconds one fault, waiting (up to 10 s) for a write to run on the
victim first:

* a worker host lost (link down, every process SIGKILLed: peers keep half-open
  connections); it boots again with a new worker once the fleet has recovered;
* a worker host partitioned for ``--partition-s`` seconds, then healed;
* ``redis``: the Redis host lost for 10-20 s, then Redis restarted on its append-only
  file (no Sentinel: the fleet waits for it);
* ``sentinel``: the Redis primary's host lost (its Sentinel with it): the other two
  Sentinels promote the replica and the fleet follows; the host boots 10-20 s after
  the loss, its Redis becomes the new primary's replica, and the pair is whole again
  before the next fault;
* ``rabbitmq``: a RabbitMQ node lost for 15-25 s, then started again (it rejoins).

For each fault: ``probe`` (a read sent as it began, until its result) and ``drain`` (the
invocations it caught unanswered, until the last result). At the end: invocations,
writes vs ledger lines, lost, duplicate writes, batches broken, the longest recovery per
fault (and, for a primary lost, the longest failover: the loss until a Sentinel named the
new primary). Exit 1 when anything was lost, a write ran twice or a batch broke.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import random
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.support import netns  # noqa: E402
from tests.support.hosts_faults import (  # noqa: E402
    FaultRecord,
    Fleet,
    PrimaryLoss,
    Tally,
    lose_and_restart,
    lose_host,
    partition_host,
)
from tests.support.hosts_rig import HostsRig, Layout, hosts_rig  # noqa: E402
from tests.support.hosts_services import restart_rabbit_node  # noqa: E402


class Chaos:
    """Picks and does the faults, brings lost worker hosts back, and restarts a worker that
    exited by itself (as a supervisor or a container's restart policy would)."""

    def __init__(self, rig: HostsRig, fleet: Fleet, args: argparse.Namespace) -> None:
        self.rig, self.fleet, self.args = rig, fleet, args
        self.rng = random.Random(args.seed)
        self.exits: list[str] = []  # workers that exited by themselves, and why

    def supervise(self) -> None:
        """Start a new worker on every worker host whose worker exited by itself."""
        for n in range(1, self.args.hosts + 1):
            name = f"work{n}"
            mine = [w for w in self.rig.workers if w.host.name == name]
            if mine and not any(w.alive() for w in mine):
                last = mine[-1].log.read_text(errors="replace")
                why = next((line.split("] ", 1)[-1] for line in reversed(last.splitlines())
                            if "CRITICAL" in line), "no CRITICAL line")
                self.exits.append(f"{name}: {why[:160]}")
                print(f"  worker on {name} exited ({why[:160]}); starting another",
                      file=sys.stderr, flush=True)
                self.rig.start_worker(name)

    def kinds(self) -> list[str]:
        third = {"redis": "redis host lost", "sentinel": "redis primary host lost"}.get(
            self.args.topology, "rabbitmq node lost")
        kinds = ["worker host lost", "worker host partitioned", third]
        chosen = [k for k in kinds if not self.args.faults or k in self.args.faults]
        return chosen or kinds

    def once(self) -> FaultRecord:
        kind = self.rng.choice(self.kinds())
        workers = [f"work{n}" for n in range(1, self.args.hosts + 1)]
        victim = self.rig.host(self.rng.choice(workers))
        self.fleet.writing_on(victim, timeout=10)
        action, name = self._action(kind, victim)
        on_primary = kind == "redis primary host lost"
        record = self.fleet.fault(name, action, victim=None if on_primary else victim)
        if kind == "worker host lost":
            victim.revive()
            self.rig.start_worker(victim.name)
        record.name = kind
        return record

    def _action(self, kind: str, victim: netns.Host) -> tuple[Callable[[], None], str]:
        down_s = self.rng.uniform(10, 20)
        if kind == "worker host lost":
            return lose_host(victim), f"{victim.name} lost"
        if kind == "worker host partitioned":
            return partition_host(victim, self.args.partition_s), f"{victim.name} cut off"
        if kind == "redis primary host lost":
            loss = PrimaryLoss(self.rig, down_s)
            return loss, f"{loss.victim.name} (primary) lost"
        if kind == "redis host lost":
            host = self.rig.host("redis1")
            return lose_and_restart(host, down_s, lambda: self.rig.start_redis("redis1")), kind
        node = self.rng.choice(["rmq1", "rmq2", "rmq3"])
        restart = functools.partial(restart_rabbit_node, self.rig, node)
        return lose_and_restart(self.rig.host(node), down_s + 5, restart), f"{node} lost"


def soak(args: argparse.Namespace, root: Path) -> tuple[Tally, list[FaultRecord], float]:
    layout = Layout(topology=args.topology, workers=args.hosts, tls=args.tls,
                    recovery_s=args.recovery_s)
    started = time.monotonic()
    with hosts_rig(root, layout) as rig:
        for n in range(1, args.hosts + 1):
            rig.start_worker(f"work{n}")
        fleet = Fleet(rig)
        fleet.start_load(args.minutes * 60, rate=args.rate, slow=0.33,
                         batch_lines=args.batch_lines, batch_every=args.batch_every, chunk=20,
                         timeout_s=args.timeout_s, seed=args.seed)
        chaos = Chaos(rig, fleet, args)
        end = started + args.minutes * 60
        while time.monotonic() + args.chaos_every < end:
            time.sleep(args.chaos_every)  # the pace of the chaos
            chaos.supervise()
            record = chaos.once()
            print(f"  {time.strftime('%H:%M:%S')} {record.name} (during a write: "
                  f"{record.during_write}): probe {record.probe_s:.1f} s, drain "
                  f"{record.drain_s:.1f} s ({record.caught} caught), the fault "
                  f"{record.lasted_s:.1f} s", file=sys.stderr, flush=True)
        fleet.stop_load(timeout=args.minutes * 60 + 300)
        tally = fleet.tally()
        args.worker_exits = chaos.exits
        args.notes = {**log_notes(rig),
                      "probe sends that raised (sent again under a new id)":
                      len(fleet.probe_errors)}
        return tally, fleet.faults, time.monotonic() - started


def log_notes(rig: HostsRig) -> dict[str, int]:
    """What the logs say about replication: failovers the never-lost Sentinel (on ``prod``)
    saw, and the workers' warnings that no replica acknowledged a decisive write in time
    (said at most once a minute per process: a lower bound)."""
    if not rig.layout.sentinels:
        return {}
    sentinel = rig.root / "sentinel-prod" / "sentinel.log"
    switches = sentinel.read_text(errors="replace").count("+switch-master")
    unacked = sum(w.log.read_text(errors="replace").count("no replica acknowledged")
                  for w in rig.workers if w.log.exists())
    return {"failovers (+switch-master, prod's Sentinel)": switches,
            "worker warnings 'no replica acknowledged ... within N ms'": unacked}


def by_kind(faults: list[FaultRecord]) -> dict[str, dict[str, Any]]:
    kinds: dict[str, dict[str, Any]] = {}
    for record in faults:
        row = kinds.setdefault(record.name, {"count": 0, "during_write": 0, "probe_s": 0.0,
                                             "drain_s": 0.0, "after_end_s": 0.0,
                                             "failover_s": 0.0})
        row["failover_s"] = round(max(row["failover_s"], record.failover_s), 1)
        after = max(record.probe_s, record.drain_s) - record.lasted_s
        row["after_end_s"] = round(max(row["after_end_s"], after), 1)
        row["count"] += 1
        row["during_write"] += int(record.during_write)
        row["probe_s"] = round(max(row["probe_s"], record.probe_s), 1)
        row["drain_s"] = round(max(row["drain_s"], record.drain_s), 1)
    return kinds


def print_report(args: argparse.Namespace, tally: Tally, faults: list[FaultRecord],
                 elapsed: float) -> None:
    print(f"soak across hosts on {args.topology}{' (TLS)' if args.tls else ''}, "
          f"{args.hosts} worker hosts, {args.minutes:g} min ({elapsed:.0f} s in all)")
    print(f"command: {args.command}")
    print(f"invocations: {tally.sent:,} sent ({tally.unsure_sends} sends raised), "
          f"{tally.batches} batches ({tally.batches_broken} broken)")
    print(f"lost: {tally.lost}")
    print(f"writes that must run once: {tally.writes:,}; ledger lines: "
          f"{tally.write_ledger_lines:,}; duplicates: {tally.duplicate_writes}")
    print(f"answered write_interrupted: {tally.write_interrupted}")
    print("failed results: " + (", ".join(f"{k} {v}" for k, v in tally.failures.items())
                                or "none"))
    print(f"workers that exited by themselves (restarted): {len(args.worker_exits)}")
    for why in args.worker_exits:
        print(f"  {why}")
    print("faults (count, during a write; longest probe, drain, and recovery past the "
          "fault's end):")
    for kind, row in sorted(by_kind(faults).items()):
        failover = f"  failover {row['failover_s']:.1f} s" if row["failover_s"] else ""
        print(f"  {kind:<26} {row['count']:>3} {row['during_write']:>3} "
              f"{row['probe_s']:>7.1f} s {row['drain_s']:>7.1f} s {row['after_end_s']:>7.1f} s"
              f"{failover}")
    for name, count in args.notes.items():
        print(f"{name}: {count}")
    print("HELD" if tally.held else "BROKEN: lost, duplicate writes or broken batches")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", choices=("redis", "sentinel", "rabbitmq"),
                        default="redis")
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--hosts", type=int, default=2, help="worker hosts (2)")
    parser.add_argument("--tls", action="store_true", help="rediss:// between hosts")
    parser.add_argument("--rate", type=float, default=2.0, help="single writes a second (2)")
    parser.add_argument("--batch-every", type=float, default=60.0)
    parser.add_argument("--batch-lines", type=int, default=120)
    parser.add_argument("--chaos-every", type=float, default=45.0, help="seconds between faults")
    parser.add_argument("--partition-s", type=float, default=60.0)
    parser.add_argument("--recovery-s", type=float, default=8.0, help="CLEVERAGENTS_RECOVERY_S")
    parser.add_argument("--timeout-s", type=float, default=10.0, help="each request's timeout")
    parser.add_argument("--faults", type=lambda text: text.split(","), default=[],
                        help="only these faults, comma-separated (e.g. 'rabbitmq node lost')")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--keep", action="store_true", help="keep the rig's folder (logs)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    args.seed = random.randrange(1 << 30) if args.seed is None else args.seed
    args.command = shlex.join(["benchmarks/soak_hosts.py", *(argv or sys.argv[1:])])
    problem = netns.missing()
    if problem is not None:
        print(f"soak_hosts: {problem}", file=sys.stderr)
        return 2
    print(f"seed {args.seed}", file=sys.stderr)
    root = Path(tempfile.mkdtemp(prefix="soak-hosts-"))
    tally, faults, elapsed = soak(args, root)
    if args.keep:
        print(f"kept: {root}", file=sys.stderr)
    else:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        fields = {f.name: getattr(tally, f.name) for f in dataclasses.fields(tally)}
        print(json.dumps({**fields, "held": tally.held, "worker_exits": args.worker_exits,
                          "notes": args.notes,
                          "faults": by_kind(faults), "elapsed_s": round(elapsed, 1)}))
    else:
        print_report(args, tally, faults, elapsed)
    return 0 if tally.held else 1


if __name__ == "__main__":
    sys.exit(main())
