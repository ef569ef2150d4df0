"""What the replica wait costs: a write's decisive writes, and a submit, with and without.

    .venv/bin/python benchmarks/replica_wait.py [--writes 2000] [--sends 500] [--rounds 5]
        [--wait-ms 100]

A private primary and its replica (``tests/support/sentinel.py``, no Sentinels). Each
write a worker runs makes two decisive writes in the guard store: its claim before
the tool, its outcome after (``stores/replication.py``); and each invocation is
published once (``SkillClient.submit``: the message and its ``task-sent`` event in
one pipeline). Both are timed here, with ``WAIT 1 <ms>`` and without, in
alternating rounds (so that the machine's load falls on both alike); it prints the
median time of each and their ratio.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import redis  # noqa: E402

from cleveragents.client import SkillClient  # noqa: E402
from cleveragents.settings import Settings  # noqa: E402
from cleveragents.stores.base import Claim  # noqa: E402
from cleveragents.stores.redis import RedisGuardStore  # noqa: E402
from cleveragents.stores.replication import ReplicaWait  # noqa: E402
from tests.support.sentinel import sentinel_fleet  # noqa: E402


def one_round(store: RedisGuardStore, writes: int) -> float:
    """Microseconds per write: a claim and an outcome for each of ``writes`` new ids."""
    prefix = uuid.uuid4().hex[:8]
    started = time.perf_counter()
    for n in range(writes):
        request_id = f"{prefix}-{n}"
        store.claim(request_id, Claim.mine(60))
        store.finish(request_id, {"success": True})
    return (time.perf_counter() - started) / writes * 1e6


def send_round(client: SkillClient, sends: int) -> float:
    """Microseconds per ``submit`` of a read, ``sends`` times (no worker: they queue)."""
    prefix = uuid.uuid4().hex[:8]
    started = time.perf_counter()
    for n in range(sends):
        arguments = {"path": "x", "key": f"{prefix}-{n}"}
        client.submit(client.build_request("test/faults", "test/read", arguments))
    return (time.perf_counter() - started) / sends * 1e6


def _client(port: int, wait_ms: int, home: str) -> SkillClient:
    env = {
        "CLEVERAGENTS_BROKER_URL": f"redis://127.0.0.1:{port}/0",
        "CLEVERAGENTS_HOME": home,
        "CLEVERAGENTS_REPLICA_WAIT_MS": str(wait_ms),
    }
    return SkillClient(settings=Settings.from_env(env))


def _line(what: str, without: float, with_wait: float, wait_ms: int) -> str:
    return (
        f"{what:<28} without WAIT {without:8.1f} us, with WAIT 1 {wait_ms}: {with_wait:8.1f} us"
        f"  ratio {with_wait / without:.2f}x (+{with_wait - without:.1f} us)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=2000)
    parser.add_argument("--sends", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--wait-ms", type=int, default=100)
    args = parser.parse_args(argv)
    with sentinel_fleet(sentinels=0) as pair:
        client = redis.Redis(port=pair.ports["primary"], socket_timeout=10)
        plain = RedisGuardStore(client, ttl_s=600)
        waiting = RedisGuardStore(client, ttl_s=600, replicas=ReplicaWait(args.wait_ms))
        home = tempfile.mkdtemp(prefix="replica-wait-")
        senders = [_client(pair.ports["primary"], ms, home) for ms in (0, args.wait_ms)]
        one_round(plain, 200)  # warm up: connections made, scripts loaded
        send_round(senders[0], 50)
        send_round(senders[1], 50)
        times: dict[str, list[float]] = {name: [] for name in ("w0", "w1", "s0", "s1")}
        for _ in range(args.rounds):
            times["w0"].append(one_round(plain, args.writes))
            times["w1"].append(one_round(waiting, args.writes))
            times["s0"].append(send_round(senders[0], args.sends))
            times["s1"].append(send_round(senders[1], args.sends))
        info = client.info("replication")
        for sender in senders:
            sender.close()
        shutil.rmtree(home, ignore_errors=True)
    median = {name: statistics.median(values) for name, values in times.items()}
    print(f"{args.rounds} alternating rounds, medians, one replica on loopback")
    print(_line(f"a write ({args.writes} a round)", median["w0"], median["w1"], args.wait_ms))
    print(_line(f"a submit ({args.sends} a round)", median["s0"], median["s1"], args.wait_ms))
    print(f"replicas connected: {info.get('connected_slaves')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
