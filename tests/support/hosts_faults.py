"""Faults a real fleet meets, on the multi-host rig, and the promises counted under them.

``Fleet`` runs the producers (``tests/support/hosts_load.py`` on host ``prod``), does a
fault while they run (``Fleet.fault``) and measures two recoveries from its start:

* ``probe_s``: a quick read sent from the console as the fault begins, until its result
  is stored: how long the fleet could not serve a new invocation;
* ``drain_s``: every invocation sent before the fault and unanswered at its start,
  until the last of them has a result: how long the work caught by the fault took.

``Fleet.tally`` then counts, against the ledger of executions the fault tools keep:
nothing lost (every request sent has a result), no write run twice per request id,
batches whole and in input order.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cleveragents.client import SkillClient
from cleveragents.skills import SkillResult
from tests.support.fault_rig import READ, WRITE, Records, reason, request, submit
from tests.support.hosts_rig import SENTINEL_HOSTS, HostsRig, fleet_process_env, wait_for
from tests.support.hosts_services import await_replica, start_sentinel
from tests.support.netns import Host
from tests.support.procs import REPO

#: The longest a fault's recovery is watched for.
WATCH_S = 400.0
#: How many ids are read from the result store in one round trip.
READ_BATCH = 500


@dataclass
class FaultRecord:
    """One fault, and how long the fleet took to recover from it."""

    name: str
    during_write: bool
    probe_s: float = float("inf")
    drain_s: float = float("inf")
    caught: int = 0  # invocations unanswered when it began
    lasted_s: float = 0.0  # how long the fault itself went on (a partition, a reboot)
    failover_s: float = 0.0  # a primary lost: until a Sentinel named the new one


@dataclass
class Tally:
    """The promises, counted at the end of a run."""

    sent: int = 0
    unsure_sends: int = 0  # sends that raised: they may or may not have reached the broker
    lost: int = 0
    writes: int = 0
    write_ledger_lines: int = 0
    duplicate_writes: int = 0
    write_interrupted: int = 0
    batches: int = 0
    batches_broken: int = 0
    failures: Counter[str] = field(default_factory=Counter)

    @property
    def held(self) -> bool:
        return self.lost == 0 and self.duplicate_writes == 0 and self.batches_broken == 0


class Fleet:
    """The load on ``prod`` and the console's view of it."""

    def __init__(self, rig: HostsRig, name: str = "load") -> None:
        self.rig = rig
        self.out = rig.root / name
        self.out.mkdir(exist_ok=True)
        self.records = Records(rig.ledger)
        self.client: SkillClient = rig.client()
        self.proc: Any = None
        self.faults: list[FaultRecord] = []
        self.serial = 0
        self.probe_errors: list[str] = []  # probe sends that raised, and when

    def start_load(self, seconds: float, **options: Any) -> None:
        """Start the producers on ``prod`` for ``seconds`` (options: ``hosts_load``'s)."""
        argv = [sys.executable, "-m", "tests.support.hosts_load", "--out", str(self.out),
                "--ledger", str(self.rig.ledger), "--seconds", f"{seconds:g}",
                "--prefix", self.out.name]
        for name, value in options.items():
            argv += [f"--{name.replace('_', '-')}", str(value)]
        env = {**self.rig.env(), "CLEVERAGENTS_HOME": str(self.out / "home"),
               "PYTHONPATH": str(REPO)}
        self.proc = self.rig.host("prod").start(argv, env=fleet_process_env(env), cwd=REPO,
                                                log=self.out / "load.log")

    def stop_load(self, timeout: float = 300) -> None:
        """Ask the producers to stop, and wait until their batches have ended."""
        (self.out / "stop").touch()
        wait_for(lambda: (self.out / "done").exists() or self.proc.poll() is not None,
                 timeout, "the producers to end")

    def sent(self) -> tuple[dict[str, dict[str, Any]], set[str]]:
        """Every request sent so far (id to entry), and the ids whose send raised."""
        sent: dict[str, dict[str, Any]] = {}
        unsure: set[str] = set()
        with contextlib.suppress(FileNotFoundError):
            for line in (self.out / "sent.jsonl").read_text().splitlines():
                with contextlib.suppress(ValueError):
                    entry = json.loads(line)
                    if entry.get("failed"):
                        unsure.add(entry["id"])
                    else:
                        sent[entry["id"]] = entry
        # A send that raised was never promised: its producer was told it failed (it may
        # still have reached the broker; its ledger lines are counted in ``tally``)
        for rid in unsure:
            sent.pop(rid, None)
        return sent, unsure

    def results(self, ids: list[str]) -> dict[str, SkillResult | None]:
        """The stored result of each id (None: none yet), read in bulk from the console."""
        found: dict[str, SkillResult | None] = {}
        for start in range(0, len(ids), READ_BATCH):
            part = ids[start:start + READ_BATCH]
            payloads = self.client.results.get_payloads(part)
            found.update({rid: None if p is None else SkillResult.model_validate(p)
                          for rid, p in zip(part, payloads, strict=True)})
        return found

    def unanswered(self) -> list[str]:
        sent, _ = self.sent()
        results = self.results(list(sent))
        return [rid for rid, result in results.items() if result is None]

    def probe(self) -> str:
        self.serial += 1
        body = request(READ, f"{self.out.name}-probe{self.serial:04d}", self.rig.ledger)
        return submit(self.client, body)

    def _send_probe(self, started: float) -> str:
        """A probe sent while the store may be away: a send that raised (a publish that
        met the old primary, now a replica) is counted and sent again under a new id,
        as a caller told the send failed would."""
        while True:
            try:
                return self.probe()  # waits (Celery retries the publish) while Redis is away
            except Exception as exc:
                self.probe_errors.append(f"{time.monotonic() - started:.1f} s: {exc!r}"[:200])
                if time.monotonic() - started > WATCH_S:
                    raise
                time.sleep(0.1)  # the Sentinels electing; bounded by WATCH_S

    # ------------------------------------------------------------------ faults
    def writing_on(self, host: Host, timeout: float = 30) -> bool:
        """Wait until a slow write (1.5 s) has just started on ``host``; False if none did."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            sent, _ = self.sent()
            recent = time.time() - 0.8
            for key, pid, at in self.records.lines()[-300:]:
                entry = sent.get(key, {})
                if at > recent and entry.get("tool") == WRITE and entry.get("slow") \
                        and host.owns(pid):
                    return True
            time.sleep(0.05)  # a bounded poll (timeout) of the ledger the tools append to
        return False

    def fault(self, name: str, action: Callable[[], None], *,
              victim: Host | None) -> FaultRecord:
        """Do ``action`` (the fault: it returns once it is over, e.g. healed) and measure the
        recovery from its start while it goes on. ``during_write``: a write had started on
        ``victim`` (None: on any host) and was unanswered as the fault began."""
        caught = self.unanswered()
        sent, _ = self.sent()
        waiting = set(caught)
        record = FaultRecord(name, any(
            key in waiting and sent[key]["tool"] == WRITE
            and (victim is None or victim.owns(pid))
            for key, pid, _ in self.records.lines()
        ))
        record.caught = len(caught)
        # A fault that sets ``action.lost`` is probed once it is in place: a probe sent
        # before could be served before the fault, or taken by the host it hits
        lost: threading.Event | None = getattr(action, "lost", None)
        probe = None if lost is not None else self.probe()
        started = time.monotonic()
        watch = threading.Thread(target=self._watch,
                                 args=(record, probe or lost, caught, started), daemon=True)
        watch.start()
        action()
        record.lasted_s = time.monotonic() - started
        record.failover_s = getattr(action, "failover_s", 0.0)
        watch.join(WATCH_S + 10)
        self.faults.append(record)
        return record

    def _watch(self, record: FaultRecord, probe: str | threading.Event, caught: list[str],
               started: float) -> None:
        if isinstance(probe, threading.Event):
            probe.wait(WATCH_S)
            probe = self._send_probe(started)
        waiting = set(caught)
        while time.monotonic() - started < WATCH_S:
            with contextlib.suppress(Exception):  # the store may be away for a while
                results = self.results([probe, *waiting])
                if results[probe] is not None and record.probe_s == float("inf"):
                    record.probe_s = time.monotonic() - started
                waiting = {rid for rid in waiting if results[rid] is None}
                if not waiting and record.drain_s == float("inf"):
                    record.drain_s = time.monotonic() - started
                if record.probe_s < float("inf") and record.drain_s < float("inf"):
                    return
            time.sleep(0.1)  # a bounded poll (WATCH_S) of the results

    # ------------------------------------------------------------------ the count
    def tally(self, timeout: float = 300) -> Tally:
        """Wait (bounded) for every sent request's result, then count the promises."""
        sent, unsure = self.sent()
        with contextlib.suppress(TimeoutError):
            wait_for(lambda: not self.unanswered(), timeout, "every result", interval=1)
        results = self.results(list(sent))
        counts = self.records.counts()
        tally = Tally(sent=len(sent), unsure_sends=len(unsure))
        for rid, entry in sent.items():
            result = results.get(rid)
            if result is None:
                tally.lost += 1
                continue
            if entry["tool"] == WRITE:
                tally.writes += 1
                tally.write_ledger_lines += counts[rid]
                tally.duplicate_writes += max(0, counts[rid] - 1)
            if not result.success and result.error is not None:
                why = reason(result)
                tally.write_interrupted += int(why == "write_interrupted")
                tally.failures[f"{result.error.error_type.value}/{why or '-'}"] += 1
        tally.duplicate_writes += sum(max(0, counts[rid] - 1) for rid in unsure)
        self._count_batches(tally)
        return tally

    def _count_batches(self, tally: Tally) -> None:
        with contextlib.suppress(FileNotFoundError):
            for line in (self.out / "batches.jsonl").read_text().splitlines():
                batch = json.loads(line)
                tally.batches += 1
                whole = batch["ended"] and batch["results"] == batch["lines"]
                broken = not (whole and batch["in_order"]) or bool(batch["error"])
                tally.batches_broken += int(broken)


class HostFault:
    """A fault on one host, as an action for ``Fleet.fault``: ``start`` puts it in place,
    ``lost`` is then set and the probe (a *new* invocation) goes (one sent before could
    be taken by the host just before it went, and be caught work instead); ``after`` is
    the rest of the fault (its length, the host's return)."""

    def __init__(self, start: Callable[[], None], after: Callable[[], None] = lambda: None):
        self.start, self.after = start, after
        self.lost = threading.Event()

    def __call__(self) -> None:
        self.start()
        self.lost.set()
        self.after()


def lose_host(host: Host) -> HostFault:
    """The fault: ``host`` vanishes (link down, every process SIGKILLed)."""
    return HostFault(host.lose)


def partition_host(host: Host, seconds: float) -> HostFault:
    """The fault: ``host`` cut off for ``seconds``, then healed."""

    def heal_after() -> None:
        try:
            time.sleep(seconds)  # the partition's length is the fault itself
        finally:
            host.heal()

    return HostFault(host.partition, heal_after)


def lose_and_restart(host: Host, down_s: float, restart: Callable[[], None]) -> HostFault:
    """The fault: ``host`` vanishes for ``down_s`` seconds, then boots and ``restart``s its
    servers (a Redis on its append-only file, a RabbitMQ node that rejoins its cluster)."""

    def boot_after() -> None:
        time.sleep(down_s)  # how long the machine is away is the fault itself
        host.revive()
        restart()

    return HostFault(host.lose, boot_after)


class PrimaryLoss:
    """The fault: the Redis primary's host vanishes (the sentinel topology: link down, its
    Redis and Sentinel SIGKILLed) and the other two Sentinels promote the replica.

    ``failover_s``: from the loss until a Sentinel names the new primary. With ``down_s``
    the host boots again that long after the loss and starts its Redis as a replica of
    the new primary (what it had that the replica had not is dropped), then its Sentinel;
    the action ends once the pair is whole again, so that the next loss can fail over too.

    Started as the primary it was, the old server took writes for 11 s before the
    Sentinels turned it into a replica, and its Sentinel, back on its old config, named it
    to clients for the second before it heard of the failover: 25 results written there
    were dropped by its resync (docs/deployment.md, Redis Sentinel: boot as a replica)."""

    def __init__(self, rig: HostsRig, down_s: float | None = None) -> None:
        self.rig, self.down_s = rig, down_s
        self.victim = rig.primary()
        self.failover_s = float("inf")
        self.lost = threading.Event()  # set once the host is gone: the probe goes then

    def __call__(self) -> None:
        victim = self.victim
        lost_at = time.monotonic()
        victim.lose()
        self.lost.set()
        wait_for(lambda: self.rig.primary(skip=victim.name) is not victim, 60,
                 "the Sentinels to promote the replica", interval=0.1)
        self.failover_s = time.monotonic() - lost_at
        if self.down_s is None:
            return
        time.sleep(max(0.0, lost_at + self.down_s - time.monotonic()))  # the machine away
        victim.revive()
        self.rig.start_redis(victim.name, replica_of=self.rig.primary(skip=victim.name))
        if victim.name in SENTINEL_HOSTS:
            start_sentinel(self.rig, victim.name)
        await_replica(self.rig, timeout=120)
