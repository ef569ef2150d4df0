"""``cleveragents batch``: run a JSONL file of requests, or submit it in the background."""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import click
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from cleveragents.batch.api import batch_results, batch_status, run_many, submit_batch
from cleveragents.batch.seal import BatchIdTaken
from cleveragents.batch.source import BatchItem, read_jsonl
from cleveragents.cli.broker_check import cli_client
from cleveragents.cli.interrupts import Interrupts
from cleveragents.cli.render import CliFailure, err_console, print_json
from cleveragents.cli.submit_cmd import local_worker_if_embedded
from cleveragents.constants import MAX_CHUNK_ITEMS
from cleveragents.embedded.runner import LocalWorker
from cleveragents.embedded.withdraw import withdraw
from cleveragents.runtime.text import json_text
from cleveragents.settings import Settings

__all__ = ["batch"]


class Tally:
    """Counts of a run: succeeded, failed by error type, bad lines, reused results."""

    def __init__(self) -> None:
        self.done = 0
        self.succeeded = 0
        self.failures: Counter[str] = Counter()

    def add(self, payload: dict[str, Any]) -> None:
        self.done += 1
        if payload.get("success"):
            self.succeeded += 1
            return
        error = payload.get("error")
        kind = error.get("error_type", "unknown") if isinstance(error, dict) else "unknown"
        self.failures[str(kind)] += 1

    def failures_text(self) -> str:
        if not self.failures:
            return "no failures"
        return ", ".join(f"{kind} {n}" for kind, n in self.failures.most_common())


def _count_lines(path: Path) -> int:
    """The file's non-blank lines, read a megabyte at a time (a line may be any length)."""
    count, content = 0, False
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            pieces = block.split(b"\n")
            for piece in pieces[:-1]:
                count += content or bool(piece.strip())
                content = False
            content = content or bool(pieces[-1].strip())
    return count + content


def _no_such_batch(batch_id: str) -> str:
    return (
        f"no such batch: {batch_id}: use the id `cleveragents batch submit` printed, with the "
        "same CLEVERAGENTS_BROKER_URL (a batch is kept CLEVERAGENTS_RESULT_EXPIRES_S, a week "
        "by default)"
    )


def _open_out(out_path: str) -> TextIO:
    """``--out`` opened for writing, or a one-line failure that says what to do."""
    try:
        return open(out_path, "w", encoding="utf-8")  # the caller closes it
    except OSError as exc:
        fix = "; create its folder first" if isinstance(exc, FileNotFoundError) else ""
        raise CliFailure(f"cannot write --out {out_path}: {exc.strerror or exc}{fix}") from None


def _check_file(path: Path, allow_writes: bool) -> list[BatchItem]:
    return [item for item in read_jsonl(path, allow_writes=allow_writes) if item.problem]


def _input(path_text: str, allow_writes: bool, strict: bool) -> Path:
    path = Path(path_text)
    if not path.is_file():
        raise CliFailure(f"no such file: {path_text}")
    if strict:
        bad = _check_file(path, allow_writes)
        if bad:
            for item in bad:
                click.echo(f"error: {item.problem}", err=True)
            raise CliFailure(f"{len(bad)} invalid line(s); nothing was run (--strict)")
    return path


def _progress(total: int) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TaskProgressColumn(),
        TextColumn("{task.fields[rate]}/s"),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[written]}"),
        TextColumn("{task.fields[failures]}"),
        console=err_console,
        disable=not err_console.is_terminal,
        refresh_per_second=8,
    )


def _summary(tally: Tally, total: int, bad: list[str], elapsed: float, reused: int) -> None:
    table = Table(title="batch summary", title_justify="left", show_header=False)
    table.add_column("what")
    table.add_column("count", justify="right")
    table.add_row("requests", str(total))
    table.add_row("succeeded", str(tally.succeeded))
    for kind, n in tally.failures.most_common():
        table.add_row(f"failed: {kind}", str(n))
    if reused:
        table.add_row("reused from an earlier run", str(reused))
    table.add_row("elapsed", f"{elapsed:.1f}s")
    table.add_row("rate", f"{tally.done / elapsed:,.0f}/s" if elapsed > 0 else "-")
    err_console.print(table)
    for problem in bad[:20]:
        err_console.print(f"[red]bad line:[/] {problem}", markup=True, highlight=False)
    if len(bad) > 20:
        err_console.print(f"... and {len(bad) - 20} more bad lines")


def _exit_code(tally: Tally, bad: list[str]) -> int:
    if bad:
        return 2
    return 1 if tally.failures else 0


def _write_all(
    runner: Any,
    out: TextIO,
    tally: Tally,
    progress: Progress,
    task: Any,
    bad: list[str],
    bad_lines: dict[int, str],
) -> None:
    """Write each result in input order; the bar counts lines finished in any order (the
    work done), and says how many are written beside it, also while the line whose turn
    it is still runs (``runner.on_idle``)."""
    started = time.monotonic()
    last = [0.0]

    def show() -> None:
        now = time.monotonic()
        if now - last[0] > 0.1:
            last[0] = now
            _show(progress, task, runner, tally, started)

    runner.on_idle = show
    for entry in runner:
        payload = entry.payload or {}
        out.write(json_text(payload) + "\n")
        tally.add(payload)
        problem = bad_lines.pop(entry.line, None)
        if problem:
            bad.append(problem)
        show()


def _show(progress: Progress, task: Any, runner: Any, tally: Tally, started: float) -> None:
    finished = max(runner.finished, tally.done)
    elapsed = time.monotonic() - started
    rate = finished / elapsed if elapsed > 0 else 0.0
    progress.update(
        task,
        completed=finished,
        rate=f"{rate:,.0f}",
        written=f"written {tally.done:,}",
        failures=tally.failures_text(),
    )


class _BadLines(dict[int, str]):
    """Line numbers of invalid lines (found while reading) and why."""


def _tracked(items: Iterator[BatchItem], bad_lines: _BadLines) -> Iterator[BatchItem]:
    for item in items:
        if item.problem:
            bad_lines[item.line] = item.problem
        yield item


out_option = click.option(
    "--out",
    "out_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="Write one result a line here, in input order.",
)
allow_writes_option = click.option(
    "--allow-writes",
    is_flag=True,
    help="Honour allow_writes on the file's lines (without it no line may write).",
)


@click.group()
def batch() -> None:
    """Run many invocations from a JSONL file (one request a line)."""


def _what_happens_to_the_rest(
    settings: Settings, local: LocalWorker | None, messages: list[str], batch_id: str
) -> str:
    """What becomes of the submitted work on Ctrl-C, said truly."""
    if not settings.embedded:
        return "what was submitted keeps running on the workers."
    if local is not None and not local.stopped_worker:
        return "what was submitted keeps running on the local worker another command shares."
    # This command's worker stopped with it: take back what no worker ran, or it would
    # wait in the home's server and run, unasked, whenever a worker next starts on this home.
    withdraw(settings, messages, batch_id=batch_id)
    return "the local worker stopped, and what it had not run was taken off the queue."


def _refuse_out_as_input(out_path: str, path: Path) -> None:
    if Path(out_path).exists() and Path(out_path).samefile(path):
        raise CliFailure(
            f"--out {out_path} is the input file: writing the results there would erase "
            "the requests before they are read; give --out another file"
        )


def _say_interrupted(written: str, out_path: str, rest: str, interrupts: Interrupts) -> None:
    """Say what a Ctrl-C before the end left, and exit 130."""
    click.echo(
        f"\ninterrupted: {written} results written to {out_path}; {rest} Run the same "
        "command again to resume (stored results are reused, nothing runs twice).",
        err=True,
    )
    interrupts.settle()
    raise click.exceptions.Exit(130) from None


def _finish(tally: Tally, bad: list[str], out_path: str, interrupts: Interrupts) -> None:
    """Exit with the batch's code, or 130 saying so when a late Ctrl-C came."""
    if interrupts.settle():
        click.echo(
            f"interrupted as the batch finished: all {tally.done} results were already "
            f"written to {out_path}; nothing was stopped",
            err=True,
        )
        raise click.exceptions.Exit(130)
    raise click.exceptions.Exit(_exit_code(tally, bad))


@batch.command("run")
@click.argument("file", type=click.Path(dir_okay=False))
@out_option
@allow_writes_option
@click.option("--strict", is_flag=True, help="Run nothing if any line is not a valid request.")
@click.option(
    "--chunk-size",
    type=click.IntRange(1, MAX_CHUNK_ITEMS),
    default=None,
    help="Requests per Celery message (default 500).",
)
def run_batch(
    file: str, out_path: str, allow_writes: bool, strict: bool, chunk_size: int | None
) -> None:
    """Run every request of FILE and write every result to --out, in input order.

    Running the same command again resumes: results already stored are reused.
    """
    path = _input(file, allow_writes, strict)
    _refuse_out_as_input(out_path, path)
    total = _count_lines(path)
    settings = Settings.from_env()
    tally, bad, bad_lines = Tally(), list[str](), _BadLines()
    started = time.monotonic()
    interrupts = Interrupts.install()
    with cli_client(settings) as client, _open_out(out_path) as out:
        runner = run_many(
            client,
            _tracked(read_jsonl(path, allow_writes=allow_writes), bad_lines),
            chunk_size=chunk_size,
            total=total,  # Flower shows each chunk's items "of N"
        )
        progress = _progress(total)
        local: LocalWorker | None = None
        try:
            with local_worker_if_embedded(settings) as local, progress:
                task = progress.add_task(
                    "batch", total=total, rate="0", written="written 0", failures=""
                )
                _write_all(runner, out, tally, progress, task, bad, bad_lines)
                interrupts.finishing()  # every result is written: Ctrl-C stops nothing now
                progress.update(
                    task,
                    completed=tally.done,
                    written=f"written {tally.done:,}",
                    failures=tally.failures_text(),
                )
        except KeyboardInterrupt:
            interrupts.finishing()
            runner.stop()
            out.flush()
            rest = _what_happens_to_the_rest(settings, local, runner.messages, runner.batch_id)
            _say_interrupted(f"{tally.done} of {total}", out_path, rest, interrupts)
        # Every line has its result: a chunk still waiting holds only finished requests.
        withdraw(settings, runner.messages, batch_id=runner.batch_id)
    _summary(tally, total, bad, time.monotonic() - started, runner.reused)
    _finish(tally, bad, out_path, interrupts)


@batch.command("submit")
@click.argument("file", type=click.Path(dir_okay=False))
@allow_writes_option
@click.option("--strict", is_flag=True, help="Submit nothing if any line is not a valid request.")
@click.option("--batch-id", metavar="ID", help="Name the batch (default: a new id).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def submit_file(
    file: str, allow_writes: bool, strict: bool, batch_id: str | None, as_json: bool
) -> None:
    """Submit every request of FILE without waiting; print the batch id.

    Needs a worker serving the broker (`cleveragents worker`).
    """
    path = _input(file, allow_writes, strict)
    with cli_client() as client:
        try:
            bid, total = submit_batch(
                client,
                read_jsonl(path, allow_writes=allow_writes),
                batch_id=batch_id,
                source=str(path.resolve()),
            )
        except BatchIdTaken as exc:
            raise CliFailure(str(exc)) from None
    if as_json:
        print_json({"batch_id": bid, "total": total})
    else:
        click.echo(bid)
        click.echo(
            f"{total} requests submitted; `cleveragents batch status {bid}` to follow", err=True
        )


@batch.command("status")
@click.argument("batch_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def status(batch_id: str, as_json: bool) -> None:
    """How far batch ID has come (exit 0 when done and all succeeded, 1 otherwise)."""
    with cli_client() as client:
        found = batch_status(client, batch_id)
    if found is None:
        raise CliFailure(_no_such_batch(batch_id))
    if found.tampered is not None and not as_json:
        raise CliFailure(_changed(batch_id, found.tampered), exit_code=1)
    if as_json:
        print_json(
            {
                "batch_id": found.batch_id,
                "source": found.source,
                "total": found.total,
                "done": found.done,
                "succeeded": found.succeeded,
                "failed": found.failed,
                "failed_by_type": found.failed_by_type,
                "tampered": found.tampered,
            }
        )
    else:
        click.echo(
            f"{found.batch_id}: {found.done} of {found.total} done, "
            f"{found.succeeded} succeeded, {found.failed} failed"
            + (
                f" ({', '.join(f'{k} {v}' for k, v in found.failed_by_type.items())})"
                if found.failed_by_type
                else ""
            )
        )
    if found.tampered is not None:
        raise click.exceptions.Exit(1)
    complete = found.done >= found.total
    raise click.exceptions.Exit(0 if complete and not found.failed else 1)


def _changed(batch_id: str, problem: str) -> str:
    return (
        f"batch {batch_id}: its ledger was changed after it was submitted ({problem}); "
        "none of its results is counted or written: someone with the producers' Redis "
        "user wrote to it (docs/security.md)"
    )


@batch.command("results")
@click.argument("batch_id", metavar="ID")
@out_option
@click.option(
    "--wait/--no-wait",
    default=True,
    help="Wait for unfinished invocations (default) or stop at the first one.",
)
def results(batch_id: str, out_path: str, wait: bool) -> None:
    """Write every result of batch ID to --out, in input order."""
    with cli_client() as client:
        found = batch_status(client, batch_id)
        if found is None:
            raise CliFailure(_no_such_batch(batch_id))
        if found.tampered is not None:
            raise CliFailure(_changed(batch_id, found.tampered), exit_code=1)
        if not wait and found.done < found.total:
            raise CliFailure(
                f"{batch_id} is not finished: {found.done} of {found.total} done", exit_code=1
            )
        tally = Tally()
        with _open_out(out_path) as out:
            for entry in batch_results(client, batch_id):
                payload = entry.payload or {}
                out.write(json_text(payload) + "\n")
                tally.add(payload)
    click.echo(f"{tally.done} results written to {out_path}; {tally.failures_text()}", err=True)
    raise click.exceptions.Exit(1 if tally.failures else 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(batch())
