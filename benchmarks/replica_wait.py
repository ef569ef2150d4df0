"""What the replica wait costs a write: its decisive writes with and without ``WAIT``.

    .venv/bin/python benchmarks/replica_wait.py [--writes 2000] [--rounds 5] [--wait-ms 100]

A private primary and its replica (``tests/support/sentinel.py``, no Sentinels). Each
write a worker runs makes two decisive writes in the guard store: its claim before
the tool, its outcome after (``stores/replication.py``). Both are timed here for
``--writes`` request ids, with ``WAIT 1 <ms>`` and without, in alternating rounds
(so that the machine's load falls on both alike); it prints the median time per
write of each, their ratio, and how many waits timed out (no replica in time).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import redis  # noqa: E402

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--wait-ms", type=int, default=100)
    args = parser.parse_args(argv)
    with sentinel_fleet(sentinels=0) as pair:
        client = redis.Redis(port=pair.ports["primary"], socket_timeout=10)
        plain = RedisGuardStore(client, ttl_s=600)
        waiting = RedisGuardStore(client, ttl_s=600, replicas=ReplicaWait(args.wait_ms))
        one_round(plain, 200)  # warm up: connections made, scripts loaded
        times: dict[str, list[float]] = {"without": [], "with": []}
        for _ in range(args.rounds):
            times["without"].append(one_round(plain, args.writes))
            times["with"].append(one_round(waiting, args.writes))
        info = client.info("replication")
    without, with_wait = statistics.median(times["without"]), statistics.median(times["with"])
    print(f"{args.writes} writes x {args.rounds} rounds, claim + outcome each, one replica")
    print(f"without WAIT:        {without:8.1f} us a write (median of rounds)")
    print(f"with WAIT 1 {args.wait_ms:<4d}:   {with_wait:8.1f} us a write")
    print(f"ratio: {with_wait / without:.2f}x (+{with_wait - without:.1f} us a write)")
    print(f"replicas connected: {info.get('connected_slaves')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
