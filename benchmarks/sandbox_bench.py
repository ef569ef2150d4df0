"""The start-up cost of a sandboxed command tool against the same tool unsandboxed.

A trivial command tool (``/bin/echo '{}'``: no interpreter of its own, so the
figure is the runtime's and the sandbox's) is called N times (200 by default)
through ``invoke`` in this process, the way a worker runs it: under its
shepherd, as the tool user a root worker has (``nobody``; the worker's own user
otherwise), once with no sandbox, once with ``sandbox: true`` (no network), and
once with a list of destinations (``network: [localhost:1]``: the proxy, its
socket and the forwarder inside, run by the system's ``python3``). The calls
alternate, so a change in the machine's load falls on all three alike. Prints
the median and the 10th and 90th percentiles of each, in milliseconds.

Run from the repository root (needs bubblewrap)::

    .venv/bin/python benchmarks/sandbox_bench.py [N]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cleveragents.runtime import invoke
from cleveragents.runtime.confined import tool_user_for
from cleveragents.runtime.kinds.command import KIND as COMMAND_KIND
from cleveragents.skills import Catalogue, Skill, ToolSpec

DEFAULT_N = 200
KINDS: dict[str, Any] = {
    "unsandboxed": None,
    "sandbox: true": True,
    "network: [host:port]": {"network": ["localhost:1"]},
}


def _catalogue() -> Catalogue:
    tools = [
        ToolSpec(
            name=f"bench/t{i}",
            source="command",
            command=["/bin/echo", "{}"],
            sandbox=sandbox,
        )
        for i, sandbox in enumerate(KINDS.values())
    ]
    return Catalogue.from_skills([Skill(name="bench/sandbox", tools=tools)])


def main(n: int) -> None:
    """Time ``n`` calls of each kind of the trivial tool and print the figures."""
    COMMAND_KIND.run_as(tool_user_for(None))
    catalogue = _catalogue()
    times: dict[str, list[float]] = {label: [] for label in KINDS}
    for i in range(n + 5):
        for index, label in enumerate(KINDS):
            started = time.perf_counter()
            result = invoke({"skill": "bench/sandbox", "tool": f"bench/t{index}"}, catalogue)
            elapsed = (time.perf_counter() - started) * 1000
            if not result.success:
                raise SystemExit(f"{label}: {result.error}")
            if i >= 5:  # the first calls warm the caches (and make the one bwrap check)
                times[label].append(elapsed)
    user = COMMAND_KIND.user.name if COMMAND_KIND.user else "the worker's own user"
    print(f"{n} calls each of /bin/echo as a command tool, run as {user}")
    base = statistics.median(times["unsandboxed"])
    for label, samples in times.items():
        deciles = statistics.quantiles(samples, n=10)
        median = statistics.median(samples)
        print(
            f"{label:22} median {median:6.1f} ms  p10 {deciles[0]:6.1f}  p90 {deciles[-1]:6.1f}"
            f"  (+{median - base:5.1f} ms)"
        )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_N)
