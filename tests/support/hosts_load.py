"""The producers of the multi-host rig: a stream of single writes and recurring batches,
run on the rig's ``prod`` host as its own process::

    python -m tests.support.hosts_load --out DIR --ledger FILE [--rate 6] [--slow 0.3]
        [--batch-lines 120] [--batch-every 30] [--seconds 60]

The fleet's CLEVERAGENTS_* settings come from the environment. Every request id is
written to ``DIR/sent.jsonl`` before it is sent (``{"id", "kind", "tool"}``), and a
send that raised is written again with ``"failed": true`` (it may or may not have
reached the broker). Each batch's outcome goes to ``DIR/batches.jsonl`` (lines sent,
results got, in input order or not, the error). The run ends after ``--seconds`` or
once ``DIR/stop`` exists; ``DIR/done`` is written last.
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
from pathlib import Path
from typing import Any

from cleveragents.client import SkillClient
from tests.support.fault_rig import READ, WRITE, BatchThread, request

#: The longest a batch is waited for once the run is over.
BATCH_END_S = 240.0


class _Batch(BatchThread):
    """A batch run in a thread that keeps each result's request id, in output order."""

    def __init__(self, client: SkillClient, lines: list[dict[str, Any]], chunk_size: int) -> None:
        super().__init__(client, lines, chunk_size=chunk_size)
        self.ids: list[str] = []

    def _run(self) -> None:
        try:
            for entry in self.runner:
                self.ids.append(entry.request_id)
        except BaseException as exc:  # written to batches.jsonl
            self.error = exc


class Load:
    """The stream and the batches, writing what they sent as they send it."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out)
        self.ledger = Path(args.ledger)
        self.lock = threading.Lock()
        self.rng = random.Random(args.seed)
        self.serial = 0
        self.sent = (self.out / "sent.jsonl").open("a", encoding="utf-8")
        self.batch_log = (self.out / "batches.jsonl").open("a", encoding="utf-8")
        self.batches: list[tuple[_Batch, list[str]]] = []
        self.started = time.monotonic()

    def over(self) -> bool:
        elapsed = time.monotonic() - self.started
        return elapsed > self.args.seconds or (self.out / "stop").exists()

    def note(self, entry: dict[str, Any], log: Any = None) -> None:
        with self.lock:
            handle = log or self.sent
            handle.write(json.dumps(entry) + "\n")
            handle.flush()

    def body(self, tool: str, kind: str) -> dict[str, Any]:
        """A request; a share ``--slow`` of the stream's writes take 1.5 s (a batch's none)."""
        with self.lock:
            self.serial += 1
            key = f"{self.args.prefix}-{kind[0]}{self.serial:07d}"
        slow = kind == "single" and self.rng.random() < self.args.slow
        body = request(tool, key, self.ledger, sleep_s=1.5 if slow else 0.0)
        # A short timeout bounds a lost host's write claim (its timeout plus 30 s)
        return {**body, "timeout_s": self.args.timeout_s}

    def stream(self) -> None:
        """Single writes at ``--rate`` a second, one at a time, until the run is over."""
        client = SkillClient()
        every = 1.0 / self.args.rate
        while not self.over():
            body = self.body(WRITE, "single")
            self.note({"id": body["request_id"], "kind": "single", "tool": WRITE,
                       "slow": bool(body["arguments"]["sleep_s"])})
            try:
                client.submit(client.build_request(**body))
            except Exception as exc:  # the broker away: said, and the next one tried
                self.note({"id": body["request_id"], "failed": True, "error": repr(exc)[:200]})
                time.sleep(0.5)  # the broker away: a pause, as a retry
                continue
            time.sleep(every)  # the stream's pace: --rate sends a second
        client.close()

    def batch(self, client: SkillClient) -> None:
        """One batch of mixed writes and reads, run in the background (``run_many``)."""
        lines = [self.body(WRITE if i % 2 else READ, "batch") for i in range(self.args.batch_lines)]
        for body in lines:
            self.note({"id": body["request_id"], "kind": "batch", "tool": body["tool"],
                       "slow": bool(body["arguments"]["sleep_s"])})
        thread = _Batch(client, lines, chunk_size=self.args.chunk)
        thread.start()
        self.batches.append((thread, [body["request_id"] for body in lines]))

    def run(self) -> None:
        stream = threading.Thread(target=self.stream, name="stream")
        stream.start()
        client = SkillClient()
        next_batch = time.monotonic()
        while not self.over():
            if self.args.batch_lines and time.monotonic() >= next_batch:
                self.batch(client)
                next_batch = time.monotonic() + self.args.batch_every
            time.sleep(0.2)  # the run's pace: a batch every --batch-every s
        stream.join()
        for thread, ids in self.batches:
            ended = thread.join(BATCH_END_S)
            in_order = thread.ids == ids[: len(thread.ids)]
            self.note({"lines": len(ids), "results": len(thread.ids), "ended": ended,
                       "in_order": in_order, "error": thread.describe_error()}, self.batch_log)
        client.close()
        (self.out / "done").write_text("done\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--prefix", default="h")
    parser.add_argument("--rate", type=float, default=6.0, help="single writes a second")
    parser.add_argument("--slow", type=float, default=0.3, help="share of writes that take 1.5 s")
    parser.add_argument("--batch-lines", type=int, default=120)
    parser.add_argument("--batch-every", type=float, default=30.0)
    parser.add_argument("--chunk", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=49)
    parser.add_argument("--timeout-s", type=float, default=None, help="each request's timeout")
    Load(parser.parse_args(argv)).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
