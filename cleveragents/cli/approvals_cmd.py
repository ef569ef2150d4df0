"""``cleveragents approvals`` (list, show, approve, reject) and ``cleveragents audit``."""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from cleveragents.approvals.model import ApprovalError, Decision, Parked
from cleveragents.cli.broker_check import cli_client, require_reachable
from cleveragents.cli.render import CliFailure, console, print_json
from cleveragents.embedded.runner import local_worker_running
from cleveragents.errors import ConfigurationError
from cleveragents.pipeline.binding import content_digest
from cleveragents.runtime.text import json_text
from cleveragents.settings import Settings
from cleveragents.stores.audit_chain import verify as verify_trail
from cleveragents.stores.factory import audit_secret

__all__ = ["approvals", "audit"]

#: The width a table is laid out in when it goes to a pipe or a file: wide enough that
#: no row is folded (a table never pads itself to it).
PIPED_WIDTH = 1000


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _listed(record: Parked, now: float) -> dict[str, Any]:
    return {**record.summary(), "age_s": round(now - record.asked_at, 1)}


def _decided(decision: Decision | None) -> dict[str, Any] | None:
    if decision is None:
        return None
    return {
        "outcome": decision.outcome,
        "by": decision.by,
        "reason": decision.reason,
        "at": decision.at,
        "digest": decision.digest,
    }


@click.group()
def approvals() -> None:
    """Invocations that wait for a person's approval (docs/approvals.md)."""


@approvals.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object a line.")
def list_approvals(as_json: bool) -> None:
    """List the invocations waiting for approval, oldest first."""
    with cli_client(Settings.from_env()) as client:
        waiting = client.approvals.pending()
    now = time.time()
    if as_json:
        for record in waiting:
            print_json(_listed(record, now))
        return
    if not waiting:
        click.echo("no invocation waits for approval", err=True)
        return
    table = Table(title=f"{len(waiting)} waiting for approval", title_justify="left")
    widest = max(len(record.request_id) for record in waiting)
    # An id is copied whole into `approve`: the other columns give way, never the id.
    table.add_column("request id", min_width=widest, no_wrap=True, overflow="fold")
    for column in ("skill", "tool", "age", "asked by"):
        # folded, never clipped: a narrow terminal (or a pipe, 80 columns) shows it whole
        table.add_column(column, overflow="fold")
    for record in waiting:
        age = _age(now - record.asked_at)
        table.add_row(record.request_id, record.skill, record.tool, age, record.asked_by or "")
    # On a terminal the table fits it (columns folded); through a pipe every row is whole
    (console if console.is_terminal else Console(width=PIPED_WIDTH)).print(table)
    click.echo(
        "approve: cleveragents approvals approve ID   (show ID first: its arguments)", err=True
    )


@approvals.command("show")
@click.argument("request_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def show_approval(request_id: str, as_json: bool) -> None:
    """Show what ID asks: its skill, tool and full arguments, and any decision."""
    with cli_client(Settings.from_env()) as client:
        record, decision = _or_fail(lambda: client.approvals.show(request_id))
    shown = {
        **record.summary(),
        "digest": content_digest(record.body),
        "arguments": record.body.get("arguments"),
        "allow_writes": record.body.get("allow_writes") is True,
        "decision": _decided(decision),
    }
    if as_json:
        print_json(shown)
        return
    click.echo(f"{record.request_id}: {record.skill} / {record.tool} ({record.state})")
    click.echo(
        f"asked by {record.asked_by or 'unknown'}, {_age(time.time() - record.asked_at)} ago"
    )
    click.echo("arguments:")
    click.echo(json_text(shown["arguments"], indent=2))
    click.echo(f"digest: {shown['digest']}")
    if decision is None and record.state == "waiting":
        click.echo(
            f"approve exactly this: cleveragents approvals approve {record.request_id} "
            f"--digest {str(shown['digest'])[:16]}"
        )
    if decision is not None:
        why = f": {decision.reason}" if decision.reason else ""
        click.echo(f"{decision.outcome} by {decision.by}{why}")


@approvals.command("approve")
@click.argument("request_id", metavar="ID")
@click.option(
    "--digest",
    metavar="HEX",
    help="Approve only if the call is still the one `show` showed (its digest, or 12+ "
    "hex digits of it).",
)
@click.option("--by", metavar="NAME", help="Who approves (default: this user).")
@click.option("--reason", metavar="TEXT", help="Why, for the audit trail.")
def approve(request_id: str, digest: str | None, by: str | None, reason: str | None) -> None:
    """Approve ID: it runs once, with exactly the arguments printed."""
    settings = Settings.from_env()
    with cli_client(settings) as client:
        record, decision = _or_fail(
            lambda: client.approvals.approve_shown(
                request_id, digest=digest, by=by, reason=reason, channel="cli"
            )
        )
    click.echo(f"approved {request_id} (by {decision.by}): {record.skill} / {record.tool} with")
    click.echo(json_text(record.body.get("arguments"), indent=2))
    click.echo(f"digest {decision.digest}: {what_runs_it(settings, request_id)}")


def what_runs_it(settings: Settings, request_id: str) -> str:
    """What happens next to an approved call: on the embedded default, it runs only
    while a worker serves the home."""
    if not settings.embedded:
        return "it is sent on, and runs when a worker takes it"
    if local_worker_running(settings):
        return "it runs now, on this home's local worker"
    return (
        "it runs when a worker next serves this home, and none does now: "
        f"`cleveragents result {request_id} --wait` starts one, runs it and prints its "
        "result (so does any `submit --wait`, `batch run` or `cleveragents worker` here)"
    )


@approvals.command("reject")
@click.argument("request_id", metavar="ID")
@click.option("--reason", metavar="TEXT", required=True, help="Why: the agent reads it.")
@click.option("--by", metavar="NAME", help="Who rejects (default: this user).")
def reject(request_id: str, reason: str, by: str | None) -> None:
    """Reject ID: it ends as permission_denied, with your reason."""
    with cli_client(Settings.from_env()) as client:
        decision = _or_fail(
            lambda: client.approvals.reject(request_id, reason=reason, by=by, channel="cli")
        )
    click.echo(f"rejected {request_id} (by {decision.by}): it will not run")


def _shown(value: str) -> str:
    """A value of an audit line as one word: quoted where it has spaces or quotes."""
    plain = value and not any(c.isspace() or c in "\"'" for c in value)
    return value if plain else json.dumps(value)


@approvals.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", type=click.IntRange(1, 65535), default=8766, show_default=True, help="Port."
)
def serve(host: str, port: int) -> None:
    """Serve the approvals inbox: people approve or reject in a browser.

    On loopback by default. Anywhere else it needs CLEVERAGENTS_APPROVALS_TOKEN, and
    with it every page asks for the token and the person's name first.
    """
    # The inbox builds on the MCP SDK's Starlette: imported only when this command runs.
    from cleveragents.inbox.access import check_inbox_options
    from cleveragents.inbox.serve import InboxOptions, serve_inbox

    settings = Settings.from_env()
    try:
        check_inbox_options(host, settings.approvals_token)
    except ConfigurationError as exc:
        raise CliFailure(str(exc), exit_code=1) from None
    require_reachable(settings)
    serve_inbox(InboxOptions(host=host, port=port, token=settings.approvals_token), settings)


def _or_fail(action: Any) -> Any:
    try:
        return action()
    except ApprovalError as exc:
        raise CliFailure(str(exc), exit_code=1) from None


_SPAN = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str) -> dt.datetime:
    """``--since``: a span back from now (``90s``, ``15m``, ``2h``, ``7d``) or an ISO time."""
    span = _SPAN.match(text.strip())
    if span:
        back = float(span.group(1)) * _UNIT_S[span.group(2)]
        return dt.datetime.now(dt.UTC) - dt.timedelta(seconds=back)
    try:
        when = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise CliFailure(
            f"--since {text!r}: give a span back from now (90s, 15m, 2h, 7d) or an ISO 8601 time"
        ) from None
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object a line.")
@click.option("--request-id", metavar="ID", help="Only this invocation's events.")
@click.option("--since", metavar="WHEN", help="Only events since: 15m, 2h, 7d, or an ISO time.")
@click.option(
    "--verify",
    is_flag=True,
    help="Check the whole trail's chain: exit 1 naming each gap, trim or forged event.",
)
def audit(as_json: bool, request_id: str | None, since: str | None, verify: bool) -> None:
    """The audit trail of writes, oldest first: never an argument value."""
    if verify:
        _verify_trail(as_json)
        return
    after = parse_since(since) if since else None
    shown = 0
    with cli_client(Settings.from_env()) as client:
        for record in client.approvals.audit(request_id=request_id, since=after):
            shown += 1
            if as_json:
                print_json(record)
                continue
            extra = " ".join(
                f"{key}={_shown(record[key])}"
                for key in ("by", "reason", "gate", "error_type")
                if key in record
            )
            line = f"{record.get('at')}  {record.get('event'):<17} {record.get('request_id')}  "
            click.echo(f"{line}{record.get('skill')} / {record.get('tool')}  {extra}".rstrip())
    if not shown and not as_json:
        which = f" of {request_id}" if request_id else ""
        when = f" since {since}" if since else ""
        click.echo(f"no write events{which}{when} in the audit trail", err=True)


def _verify_trail(as_json: bool) -> None:
    """``audit --verify``: the whole trail checked against its chain (``stores/audit_chain.py``)."""
    settings = Settings.from_env()
    with cli_client(settings) as client:
        log = client.stores.audit
        report = verify_trail(log.streams(), audit_secret(settings))
    if as_json:
        print_json(
            {
                "whole": report.whole,
                "events": report.events,
                "writers": report.writers,
                "keyed": report.keyed,
                "problems": report.problems,
            }
        )
    else:
        for problem in report.problems:
            click.echo(problem)
        state = "whole" if report.whole else f"NOT whole: {len(report.problems)} problem(s)"
        click.echo(
            f"audit trail {state}: {report.events} events from {report.writers} writer(s)",
            err=True,
        )
        if not report.keyed:
            click.echo(
                "note: checked without CLEVERAGENTS_AUDIT_KEY: gaps, trims and events added by "
                "hand show, but a forger who knows the scheme could chain an event; set the "
                "workers' key here to check their seals",
                err=True,
            )
    if not report.whole:
        raise SystemExit(1)
