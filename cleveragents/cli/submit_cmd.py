"""``cleveragents submit`` and ``cleveragents result``: one invocation at a time."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import click
from celery.result import AsyncResult

from cleveragents.approvals.model import APPROVED, ApprovalError, Decision
from cleveragents.broker.redis.liveness import holders_alive
from cleveragents.cli.broker_check import cli_client
from cleveragents.cli.failure_text import failure_lines
from cleveragents.cli.render import CliFailure, print_json
from cleveragents.client import UNKNOWN, SkillClient
from cleveragents.constants import (
    QUEUE_BATCH_WRITE,
    QUEUE_READ,
    QUEUE_WRITE,
    STATE_AWAITING_APPROVAL,
)
from cleveragents.embedded.runner import LocalWorker, local_worker_running
from cleveragents.errors import (
    ConfigurationError,
    RemoteControlUnavailable,
    SchemaValidationError,
)
from cleveragents.messages import result_payload, retry_note
from cleveragents.pipeline.binding import RequestIdReused
from cleveragents.runtime.confined import tool_user_for
from cleveragents.runtime.invoke import read_json
from cleveragents.runtime.text import json_text
from cleveragents.settings import Settings
from cleveragents.skills import SkillResult

__all__ = ["result", "submit"]

#: How long ``submit --wait`` waits before it checks that a running worker consumes the queue.
QUEUE_CHECK_S = 3.0
#: The file in an embedded home that says the root note was shown there (once per home).
ROOT_NOTE_MARKER = "root-note-shown"
#: What ``submit --wait --timeout S`` (without ``--wait-timeout``) waits beyond S.
QUEUEING_ALLOWANCE_S = 60.0
WRITE_QUEUES = (QUEUE_WRITE, QUEUE_BATCH_WRITE)


def _arguments(raw: str | None, path: str | None) -> dict[str, Any]:
    if raw is not None and path is not None:
        raise CliFailure("give --args or --args-file, not both")
    text = raw
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8-sig")  # a BOM is not text
        except OSError as exc:
            raise CliFailure(f"cannot read --args-file {path}: {exc.strerror}") from None
    if text is None:
        return {}
    try:
        value = read_json(text)
    except ValueError as exc:
        raise CliFailure(f"arguments are not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise CliFailure("arguments must be a JSON object")
    return value


@contextlib.contextmanager
def local_worker_if_embedded(settings: Settings) -> Iterator[LocalWorker | None]:
    """On the embedded default, use the home's local worker for the duration of the command.

    Commands running at once on one home share one worker: the first starts it,
    the last one out stops it (``cleveragents.embedded.runner``).
    """
    if not settings.embedded:
        yield None
        return
    with LocalWorker(settings) as local:
        if local.spawned:
            _say_tool_user(settings)
        yield local


def _say_tool_user(settings: Settings) -> None:
    """Once per home, as a command starts its local worker as root: who its command tools
    run as (a marker file in the home remembers it was said)."""
    try:
        user = tool_user_for(settings.tool_user)
    except ConfigurationError:
        return  # the worker's own start says why
    if user is None or os.geteuid() != 0:
        return
    marker = settings.home / ROOT_NOTE_MARKER
    try:
        with marker.open("x", encoding="utf-8") as said:
            said.write(f"{user.name}\n")
    except FileExistsError:
        return
    except OSError:
        pass  # a home that cannot keep the marker: say it every time
    click.echo(
        f"note: the local worker runs as root, so command tools and MCP servers run as "
        f"{user.name!r}, who may not read or write files only root can (such as those in "
        "root's home); CLEVERAGENTS_TOOL_USER chooses another user",
        err=True,
    )


def show_result(
    result: SkillResult, request_id: str, as_json: bool, trace_id: str | None = None
) -> None:
    """Print a result for people, or as one JSON object (with the ``trace_id`` of its
    span, where a traced worker stored one); exit 1 when it failed."""
    if as_json:
        payload = result_payload(result, request_id)
        print_json({**payload, "trace_id": trace_id} if trace_id else payload)
    elif result.success:
        click.echo(json_text(result.output_data))
        for change in result.resource_changes:
            click.echo(f"{change.get('action')}: {change.get('resource')}", err=True)
    else:
        for line in failure_lines(result, request_id):
            click.echo(line, err=True)
    if not result.success:
        raise click.exceptions.Exit(1)


def _say_awaiting(request_id: str) -> None:
    click.echo(
        f"{request_id} waits for a person's approval: `cleveragents approvals show "
        f"{request_id}` shows it, `cleveragents approvals approve {request_id}` approves it; "
        "still waiting (Ctrl-C stops waiting, not the request)",
        err=True,
    )


def _wait(
    client: SkillClient,
    request_id: str,
    timeout: float | None,
    pending: Any = None,
    queue: str | None = None,
) -> SkillResult:
    told: list[bool] = []

    def awaiting() -> None:
        if not told:
            told.append(True)
            _say_awaiting(request_id)

    try:
        if queue is not None and not client.settings.embedded:
            early = min(QUEUE_CHECK_S, timeout) if timeout is not None else QUEUE_CHECK_S
            try:
                return client.wait(request_id, timeout=early, pending=pending)
            except TimeoutError:
                if client.state(request_id) == STATE_AWAITING_APPROVAL:
                    awaiting()
                else:
                    _warn_if_unserved(client, queue)
            timeout = None if timeout is None else max(timeout - early, 0.001)
        return client.wait(request_id, timeout=timeout, pending=pending, on_awaiting=awaiting)
    except TimeoutError as exc:
        if timeout is None:  # an endless wait ended by the client itself: its own words
            raise CliFailure(f"{exc}", exit_code=1) from None
        raise CliFailure(
            f"no result for {request_id} after {timeout:g}s; "
            f"`cleveragents result {request_id} --wait` waits for it",
            exit_code=1,
        ) from None


def _warn_if_unserved(client: SkillClient, queue: str) -> None:
    """Say on stderr when no running worker consumes ``queue`` (then keep waiting).

    Says nothing when the workers cannot be asked (a Redis user without remote control,
    as the documented ``producer``): that is "cannot tell", not "nobody".
    """
    try:
        consumers = client.consumers_of(queue)
    except RemoteControlUnavailable:
        return
    if consumers is None:
        why = "no worker answered `celery inspect`: is one running on this broker?"
    elif consumers:
        return
    elif queue in WRITE_QUEUES:
        why = (
            f"the running workers do not consume {queue}: they are read-only "
            "(CLEVERAGENTS_READ_ONLY); a write needs a worker that may write"
        )
    else:
        why = f"no running worker consumes {queue}"
    click.echo(f"warning: {why}; still waiting (Ctrl-C stops waiting, not the request)", err=True)


def wait_limit_s(timeout: float | None, wait_timeout: float | None) -> float | None:
    """How long ``submit --wait`` waits: ``--wait-timeout`` where given; else the
    invocation's ``--timeout`` plus a minute of queueing (a tool is stopped at its
    timeout, but may wait its turn first); else until the result is there."""
    if wait_timeout is not None:
        return wait_timeout
    return None if timeout is None else timeout + QUEUEING_ALLOWANCE_S


@click.command()
@click.argument("skill")
@click.argument("tool")
@click.option("--args", "args_json", metavar="JSON", help="Arguments as one JSON object.")
@click.option(
    "--args-file",
    type=click.Path(dir_okay=False),
    help="Read the arguments (a JSON object) from this file.",
)
@click.option("--allow-writes", is_flag=True, help="Let a write-capable tool run.")
@click.option("--request-id", metavar="ID", help="Use this request id (default: a new UUID).")
@click.option("--wait", is_flag=True, help="Wait for the result and print it.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    metavar="S",
    help="The invocation's timeout in seconds: the tool is stopped after it. With --wait and "
    "no --wait-timeout, the wait allows a minute of queueing on top.",
)
@click.option(
    "--wait-timeout",
    type=click.FloatRange(min=0, min_open=True),
    metavar="S",
    help="Wait at most S seconds for the result (implies --wait); the invocation goes on.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def submit(
    skill: str,
    tool: str,
    args_json: str | None,
    args_file: str | None,
    allow_writes: bool,
    request_id: str | None,
    wait: bool,
    timeout: float | None,
    wait_timeout: float | None,
    as_json: bool,
) -> None:
    """Enqueue one invocation of SKILL's TOOL; print its id, or with --wait its result."""
    wait = wait or wait_timeout is not None
    arguments = _arguments(args_json, args_file)
    settings = Settings.from_env()
    with cli_client(settings) as client:
        try:
            request = client.build_request(
                skill,
                tool,
                arguments,
                allow_writes=allow_writes,
                request_id=request_id,
                timeout_s=timeout,
            )
        except SchemaValidationError as exc:
            raise CliFailure(str(exc)) from None
        try:
            if not wait:
                client.send(request)
            else:
                with local_worker_if_embedded(settings):
                    # Wait on the send's own AsyncResult: already subscribed to the result.
                    pending = client.send(request)
                    limit = wait_limit_s(timeout, wait_timeout)
                    queue = QUEUE_WRITE if request.allow_writes else QUEUE_READ
                    outcome = _wait(client, request.request_id, limit, pending, queue)
        except RequestIdReused as refused:  # nothing was sent
            show_result(refused.result, request.request_id, as_json)
            return
        if not wait:
            if as_json:
                print_json({"request_id": request.request_id})
            else:
                click.echo(request.request_id)
            _say_when_nothing_serves(client, request.request_id)
            return
        trace_id = client.trace_id(request.request_id) if as_json else None
        show_result(outcome, request.request_id, as_json, trace_id)


def _say_when_nothing_serves(client: SkillClient, request_id: str) -> None:
    """On the embedded default with no worker running, say what runs the request."""
    if client.settings.embedded and not holders_alive(client.backend_redis()):
        click.echo(
            f"note: no worker serves this home now; `cleveragents result {request_id} --wait` "
            "starts one and prints the result (or run `cleveragents worker`)",
            err=True,
        )


@click.command()
@click.argument("request_id", metavar="ID")
@click.option("--wait", is_flag=True, help="Wait until the result is there.")
@click.option(
    "--timeout",
    "--wait-timeout",
    type=click.FloatRange(min=0, min_open=True),
    metavar="S",
    help="With --wait: give up after S seconds (--wait-timeout: the same, as submit names it).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def result(request_id: str, wait: bool, timeout: float | None, as_json: bool) -> None:
    """Print the result of one invocation (exit 1 if it failed or is not there yet)."""
    settings = Settings.from_env()
    with cli_client(settings) as client:
        found = client.get(request_id)
        state = "SUCCESS" if found is not None else client.locate(request_id)
        if state == UNKNOWN:
            _unknown(request_id, settings, as_json)
        if found is not None:
            outcome = found
        elif wait:
            with local_worker_if_embedded(settings):
                outcome = _wait(client, request_id, timeout)
        else:
            _not_yet(client, request_id, state, as_json)
        trace_id = client.trace_id(request_id) if as_json else None
        show_result(outcome, request_id, as_json, trace_id)


def _not_yet(client: SkillClient, request_id: str, state: str, as_json: bool) -> NoReturn:
    """An invocation without a result: its state (exit 1)."""
    if state == STATE_AWAITING_APPROVAL:
        meta = AsyncResult(request_id, app=client.app).info
        shown = meta if isinstance(meta, dict) else {}
        decided = _decision(client, request_id)
        if decided is not None:
            _say_decided(client.settings, request_id, decided, shown, as_json)
        if as_json:
            print_json({**shown, "request_id": request_id, "state": "awaiting_approval"})
        else:
            _say_awaiting(request_id)
        raise click.exceptions.Exit(1)
    note = retry_note(AsyncResult(request_id, app=client.app).info) if state == "RETRY" else None
    if as_json:
        shown = {"request_id": request_id, "state": state}
        if note is not None:
            shown.update(retry=note[0], next_attempt_at=note[1])
        print_json(shown)
    elif note is not None:
        click.echo(f"{request_id}: retrying (no result yet): {note[0]}", err=True)
    elif state == "REVOKED":  # Celery's word for it: the invocation was cancelled
        click.echo(
            f"{request_id}: cancelled before it ended (revoked): it has no result, and will "
            "not run",
            err=True,
        )
    else:
        click.echo(f"{request_id}: {state.lower()} (no result yet)", err=True)
    raise click.exceptions.Exit(1)

def _decision(client: SkillClient, request_id: str) -> Decision | None:
    """The decision taken on a parked invocation whose run has not stored a result yet."""
    try:
        return client.approvals.show(request_id)[1]
    except ApprovalError:
        return None


def _say_decided(
    settings: Settings, request_id: str, decision: Decision, shown: dict[str, Any], as_json: bool
) -> NoReturn:
    """A call decided and not yet run: approved, waiting to run (or rejected, to end so)."""
    state = "approved" if decision.outcome == APPROVED else "rejected"
    if as_json:
        print_json({**shown, "request_id": request_id, "state": state, "by": decision.by})
        raise click.exceptions.Exit(1)
    if decision.outcome == APPROVED:
        said = f"{request_id}: approved by {decision.by}, waiting to run"
        if settings.embedded and not local_worker_running(settings):
            said += (
                f" (no worker serves this home now: `cleveragents result {request_id} --wait` "
                "starts one, runs it and prints its result)"
            )
    else:
        said = (
            f"{request_id}: rejected by {decision.by}; it ends as permission_denied when a "
            "worker takes it"
        )
    click.echo(said, err=True)
    raise click.exceptions.Exit(1)


def _unknown(request_id: str, settings: Settings, as_json: bool) -> None:
    """An id with no result, no binding and no waiting message: exit 2, saying why."""
    if as_json:
        print_json({"request_id": request_id, "state": UNKNOWN})
        raise click.exceptions.Exit(2)
    where = f"the embedded home {settings.home.resolve()}" if settings.embedded else "this broker"
    kept = settings.result_expires_s
    kept_for = f"{kept / 86400:g} days" if kept >= 86400 else f"{kept:g} s"
    raise CliFailure(
        f"no invocation {request_id} is known to {where}: nothing was submitted under this "
        f"id, or its result expired (kept {kept_for}, "
        "CLEVERAGENTS_RESULT_EXPIRES_S); check the id `cleveragents submit` printed, and "
        "that CLEVERAGENTS_BROKER_URL / CLEVERAGENTS_HOME are the ones it was sent with"
    )
