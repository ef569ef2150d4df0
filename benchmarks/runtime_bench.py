"""Per-invocation overhead of the tool runtime, in process, with no queue.

``invoke`` does, for every call: parse the request (unless it is a model already),
look the skill and tool up, apply the write gates, validate the arguments, arm a
deadline, call the tool, check the output is JSON, validate the output and build a
``SkillResult``. This measures what that costs on top of calling the tool's
function directly:

* ``local/common`` ``local/noop`` (``cleveragents.examples.tools:noop``), request as a dict;
* the same with a ``SkillInvocationRequest`` built beforehand;
* the same from a thread that is not the main thread (the watchdog deadline);
* ``local/text-tools`` ``local/word-count``, whose input and output are
  schema-validated.

Run from the repository root::

    .venv/bin/python benchmarks/runtime_bench.py [N]
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cleveragents.examples.tools import noop, word_count

from cleveragents.runtime import SkillInvocationRequest, invoke
from cleveragents.settings import bundled_examples_path
from cleveragents.skills import Catalogue

DEFAULT_N = 50_000
REPEATS = 3
CHUNK = 5_000
TEXT = "the quick brown fox jumps over the lazy dog"


def best_per_call_us(fn: Callable[[], Any], n: int) -> float:
    """Microseconds per call: ``n`` calls ``REPEATS`` times over, in chunks; the best chunk.

    The best chunk rather than the mean: on a shared machine the noise only ever adds.
    """
    fn()  # warm up: imports, compiled schemas, caches
    chunk = min(n, CHUNK)
    best = float("inf")
    for _ in range(max(1, REPEATS * n // chunk)):
        started = time.perf_counter()
        for _ in range(chunk):
            fn()
        best = min(best, time.perf_counter() - started)
    return best / chunk * 1e6


def in_thread(fn: Callable[[], float]) -> float:
    """Run ``fn`` in a thread that is not the main thread; return what it returned."""
    box: list[float] = []
    thread = threading.Thread(target=lambda: box.append(fn()), name="bench")
    thread.start()
    thread.join()
    return box[0]


def checked(result: Any) -> Any:
    if not result.success:
        raise SystemExit(f"benchmark invocation failed: {result.error}")
    return result


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_N
    catalogue = Catalogue.from_paths(bundled_examples_path() / "skills")
    if catalogue.errors:
        raise SystemExit(f"example catalogue has errors: {catalogue.errors}")

    noop_dict = {"skill": "local/common", "tool": "local/noop", "arguments": {}}
    noop_model = SkillInvocationRequest(skill="local/common", tool="local/noop")
    count_dict = {
        "skill": "local/text-tools",
        "tool": "local/word-count",
        "arguments": {"text": TEXT},
    }
    checked(invoke(noop_dict, catalogue))
    checked(invoke(count_dict, catalogue))

    def invoke_noop_dict() -> Any:
        return invoke(noop_dict, catalogue)

    def invoke_noop_model() -> Any:
        return invoke(noop_model, catalogue)

    def invoke_count() -> Any:
        return invoke(count_dict, catalogue)

    def direct_count() -> Any:
        return word_count(text=TEXT)

    direct_noop_us = best_per_call_us(noop, n)
    direct_count_us = best_per_call_us(direct_count, n)
    rows = [
        ("noop, request as a dict", best_per_call_us(invoke_noop_dict, n), direct_noop_us),
        (
            "noop, request model built beforehand",
            best_per_call_us(invoke_noop_model, n),
            direct_noop_us,
        ),
        (
            "noop, dict, from a non-main thread",
            in_thread(lambda: best_per_call_us(invoke_noop_dict, n)),
            direct_noop_us,
        ),
        (
            "word-count (schemas in and out), dict",
            best_per_call_us(invoke_count, n),
            direct_count_us,
        ),
    ]

    print(
        f"tool runtime overhead: {REPEATS} x {n:,} calls each, best chunk of {min(n, CHUNK):,}, "
        f"Python {sys.version.split()[0]}"
    )
    print(
        f"{'case':<40} {'invoke us/call':>15} {'direct us/call':>15} "
        f"{'overhead us':>12} {'ratio':>8}"
    )
    for label, runtime_us, direct_us in rows:
        print(
            f"{label:<40} {runtime_us:>15.2f} {direct_us:>15.3f} "
            f"{runtime_us - direct_us:>12.2f} {runtime_us / direct_us:>7.0f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
