"""The multi-host rig by hand: a fleet in network namespaces, up until Ctrl-C, or the
leftovers of a crashed run removed.

    .venv/bin/python benchmarks/rig.py up [--topology redis|sentinel|rabbitmq] [--tls]
        [--workers 2]
    .venv/bin/python benchmarks/rig.py cleanup

``up`` builds the rig of ``tests/support/hosts_rig.py`` (hosts ``prod``, ``work1``...,
``redis1``, ``redis2``, with three Sentinels on ``sentinel``, or ``rmq1``-``rmq3``),
starts a worker on each worker host, prints the hosts, the fleet's settings and how to
run a command inside a host (``ip netns exec <namespace> ...``), and tears everything
down on Ctrl-C or SIGTERM.
``cleanup`` removes every namespace, veth and bridge of an earlier run whose owner is
gone (needs root, as ``up`` does). ``benchmarks/soak_hosts.py`` runs chaos on it.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import tempfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.support import netns  # noqa: E402
from tests.support.hosts_rig import Layout, hosts_rig  # noqa: E402


def up(args: argparse.Namespace) -> int:
    layout = Layout(topology=args.topology, workers=args.workers, tls=args.tls,
                    recovery_s=args.recovery_s)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with tempfile.TemporaryDirectory(prefix="rig-") as tmp, hosts_rig(Path(tmp), layout) as rig:
        for n in range(1, args.workers + 1):
            rig.start_worker(f"work{n}")
        print(f"rig {rig.net.run_name}: {rig.net.subnet}, console {rig.net.console}")
        for host in rig.net.hosts.values():
            print(f"  {host.name:<8} {host.address:<14} ip netns exec {host.ns} ...")
        for name, value in sorted(rig.env().items()):
            print(f"  {name}={value}")
        print("Ctrl-C tears it down", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            stop.wait()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("up", help="build the rig and keep it up until Ctrl-C")
    start.add_argument("--topology", choices=("redis", "sentinel", "rabbitmq"),
                       default="redis")
    start.add_argument("--workers", type=int, default=2, help="worker hosts (2)")
    start.add_argument("--tls", action="store_true", help="rediss:// between hosts")
    start.add_argument("--recovery-s", type=float, default=8.0)
    commands.add_parser("cleanup", help="remove what crashed runs left")
    args = parser.parse_args(argv)
    problem = netns.missing()
    if problem is not None:
        print(f"rig: {problem}", file=sys.stderr)
        return 2
    if args.command == "cleanup":
        removed = netns.cleanup_leftovers()
        print("removed: " + (", ".join(removed) or "nothing"))
        return 0
    return up(args)


if __name__ == "__main__":
    sys.exit(main())
