"""The embedded default before and after a change, side by side in one run.

Runs this checkout and another revision (``--before``, a git revision: checked out
in a temporary worktree and installed in a venv of its own, a minute or two) alternately,
so that a change in the machine's load falls on both alike:

* **single**: ``cleveragents submit local/text-tools local/word-count --wait`` on a home
  where nothing runs yet: the wall time of the whole command, its local worker's start
  included (what the README's first command costs after the install);
* **batch**: ``cleveragents batch run`` of ``--lines`` word-count lines (20,000 by
  default) on a fresh home: the wall time of the command, and lines a second.

Prints the median of each and the ratio after/before (below 1: the change is faster).
Run from the repository root::

    .venv/bin/python benchmarks/embedded_bench.py --before 50c3dae [--singles 5]
        [--lines 20000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("CLEVERAGENTS_")}


def _timed(args: list[str], python: Path, cwd: Path) -> float:
    started = time.perf_counter()
    done = subprocess.run(
        [str(python), "-m", "cleveragents", *args],
        cwd=cwd, env=_env(), capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{python}: {' '.join(args[:2])} failed: {done.stderr.strip()[-500:]}")
    return took


def _single(python: Path, scratch: Path) -> float:
    work = Path(tempfile.mkdtemp(dir=scratch))
    args = ["submit", "local/text-tools", "local/word-count", "--args", '{"text": "a b"}']
    return _timed([*args, "--wait"], python, work)


def _batch(python: Path, scratch: Path, lines: int) -> float:
    work = Path(tempfile.mkdtemp(dir=scratch))
    with open(work / "in.jsonl", "w", encoding="utf-8") as out:
        for i in range(lines):
            text = "w " * (i % 7 + 1)
            line = {"request_id": f"l-{i}", "skill": "local/text-tools",
                    "tool": "local/word-count", "arguments": {"text": text}}  # fmt: skip
            out.write(json.dumps(line) + "\n")
    return _timed(["batch", "run", "in.jsonl", "--out", "out.jsonl"], python, work)


def _checkout(revision: str, scratch: Path) -> tuple[Path, Path]:
    """The revision's worktree, and the Python of a venv it is installed in."""
    tree = scratch / "before"
    subprocess.run(["git", "worktree", "add", "--detach", "-q", str(tree), revision],
                   cwd=ROOT, check=True)  # fmt: skip
    subprocess.run([sys.executable, "-m", "venv", str(tree / ".venv")], check=True)
    python = tree / ".venv" / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "-e", str(tree)], check=True)
    return tree, python


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the git revision to compare with")
    parser.add_argument("--singles", type=int, default=5, help="single submits a round each")
    parser.add_argument("--lines", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="embedded-bench-"))
    before, old_python = _checkout(args.before, scratch)
    codes = {"before": old_python, "after": Path(sys.executable)}
    singles: dict[str, list[float]] = {name: [] for name in codes}
    batches: dict[str, list[float]] = {name: [] for name in codes}
    try:
        for round_ in range(args.rounds):
            order = list(codes) if round_ % 2 == 0 else list(reversed(codes))
            for _ in range(args.singles):
                for name in order:
                    singles[name].append(_single(codes[name], scratch))
            for name in order:
                batches[name].append(_batch(codes[name], scratch, args.lines))
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=ROOT,
                       check=False)  # fmt: skip
        shutil.rmtree(scratch, ignore_errors=True)
    _report(singles, batches, args.lines)


def _report(singles: dict[str, list[float]], batches: dict[str, list[float]], lines: int) -> None:
    single = {name: statistics.median(times) for name, times in singles.items()}
    batch = {name: statistics.median(times) for name, times in batches.items()}
    print(f"single submit --wait (cold home), median of {len(singles['after'])}:")
    for name in single:
        print(f"  {name:6} {single[name]:7.2f} s")
    print(f"  after/before: {single['after'] / single['before']:.2f}")
    print(f"batch run of {lines} lines, median of {len(batches['after'])}:")
    for name in batch:
        print(f"  {name:6} {batch[name]:7.2f} s  ({lines / batch[name]:,.0f} lines/s)")
    print(f"  after/before: {batch['after'] / batch['before']:.2f}")


if __name__ == "__main__":
    main()
